"""Claim family *block_scaled*: MX and NVFP4, formats whose blocks of 32 or 16 elements share a
scale, as specifications written out in exact rationals.

``blockquant`` (a quantiser's bits against the specification: torchao's, or a user's own),
``blocklinear`` (a block-scaled linear's three products against their budgets), ``blocktraining``
(block-scaled linears in the training suite's loop) and ``nvfp4_recipe`` (NVIDIA's NVFP4
pretraining recipe, emulated). The products' budgets and the localisation of a failed run are
shared with the fp8 family (:mod:`harness.domains.engines.scaled`).
"""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "block scaling"
