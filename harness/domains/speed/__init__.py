"""Claim family *speed*: AMP-vs-fp32 workloads timed interleaved, and the speed verdict."""
