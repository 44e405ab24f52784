"""Claim family *fp8*: fp8 scaling recipes as specifications, the fp8 formats' codes, scaled matmul
numerics, float8 training, the float8 all-gather and delayed scaling.

``recipes`` (what each torchao recipe casts, with which scale, for each of a linear's three
matmuls), ``adapters`` (the scaling code under test: torchao's, or a user's own), ``linear``
(Float8Linear's three products against their budgets, from :mod:`harness.domains.engines.scaled`),
``training`` (float8 linears in the training suite's loop). Block-scaled formats (MX, NVFP4) and
stochastic rounding are families of their own. torchao is imported lazily: without it the suite
skips and names what is missing.
"""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "fp8"
