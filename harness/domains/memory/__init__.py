"""Claim family *memory*: bytes saved for backward and the analytic model-state accounting."""
