"""The AMP patterns family: the shapes of a training step PyTorch's "Automatic Mixed Precision
examples" document beyond the plain one (activation checkpointing, custom autograd functions, ...),
each run in its documented form and held to a reference that does not use the path under test."""

#: Why the bitwise checks skip on a GPU: its kernels need not be deterministic, and a GPU cell
#: needs a budget derived from the formats instead, which is not written yet.
CPU_ONLY = "bit for bit needs deterministic kernels, the CPU's; a GPU cell needs a derived budget instead (not yet)"
