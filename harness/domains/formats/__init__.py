"""The formats family: the reproductions of the formats suite's checks (its arithmetic is in
:mod:`harness.numerics.formats`)."""
