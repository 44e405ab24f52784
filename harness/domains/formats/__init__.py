"""The formats family: the reproductions of the formats suite's checks (its arithmetic is in
:mod:`harness.numerics.formats`)."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "formats"
