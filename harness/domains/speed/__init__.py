"""Claim family *speed*: AMP-vs-fp32 workloads timed interleaved, and the speed verdict."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "speed"
