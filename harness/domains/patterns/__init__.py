"""The AMP patterns family: the shapes of a training step PyTorch's "Automatic Mixed Precision
examples" document beyond the plain one (activation checkpointing, custom autograd functions, ...),
each run in its documented form and held to a reference that does not use the path under test."""
