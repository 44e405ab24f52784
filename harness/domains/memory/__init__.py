"""Claim family *memory*: bytes saved for backward and the analytic model-state accounting."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "memory"
