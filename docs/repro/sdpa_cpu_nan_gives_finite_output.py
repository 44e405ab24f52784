# Reproduces sdpa-cpu-nan-gives-finite-output (torch 2.5 on, open (last verified 2.15); cpu).
# a NaN in one element of a query (or, on 2.5, a key) reaching CPU scaled_dot_product_attention
# (under autocast as in fp32): the rows it reaches come out finite (zeros) where the arithmetic
# gives NaN, hiding it from the loss; at every length on 2.5, for a query at a short sequence (5)
# from 2.6
# Where: pytorch/pytorch#141128 (NaN to zeros on the CPU in 2.5; its fix left the short path
# hiding it). Registered in amp-harness harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python sdpa_cpu_nan_gives_finite_output.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

import math
import sys

import torch
import torch.nn.functional as F

# A NaN in one element of a query reaching scaled_dot_product_attention on the CPU (under autocast
# as in fp32): the query's row comes out finite (zeros) where the arithmetic gives NaN, at a short
# sequence (length 5) or at 16, depending on the release. The NaN is hidden from the loss.
# Reference: attention written out in float64 by matmul, exp and sum.


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.matmul(weights / weights.sum(-1, keepdim=True), v.double())


outcome = {}
for length in (5, 16, 64):
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(1, 2, length, 16, generator=g) for _ in range(3))
        q[0, 0, 3, 0] = math.nan
        expected = ~reference(q, k, v).isfinite()
        with torch.autocast("cpu", dtype=dtype):
            got = ~attend(q, k, v).isfinite()
        outcome[f"length {length}, {dtype}"] = f"{int((expected & ~got).sum())} of {int(expected.sum())} hidden"
print(f"a NaN in a query under CPU autocast, non-finite outputs come out finite: {outcome}")
sys.exit(1 if any(not v.startswith("0 of") for v in outcome.values()) else 0)
