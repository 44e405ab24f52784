"""Claim family *fp8*: scaling recipes as specifications, scaled matmul numerics, float8 training.

``recipes`` (what each torchao recipe casts, with which scale, for each of a linear's three
matmuls), ``adapters`` (the scaling code under test: torchao's, or a user's own), ``matmul``
(error budgets and SQNR floors of a scaled matmul), ``training`` (float8 linears in the training
suite's loop). torchao is imported lazily: without it the suite skips and names what is missing.
"""
