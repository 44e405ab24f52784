"""Claim family *stochastic_rounding*: a rounding that promises to be unbiased, judged
statistically against that promise (``checks``): fp32 to bf16, as low-precision optimizers keep
bf16 weights, and fp32 to e2m1, as NVFP4's gradients are rounded.
"""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "stochastic rounding"
