# Reproduces sdpa-cpu-masked-key-blocks-give-nan (torch 2.4 to before 2.4.1, fixed in 2.4.1; cpu).
# CPU scaled_dot_product_attention with an additive mask over a long sequence (a sliding window):
# where a block of queries has a whole block of keys masked, the flash kernel computes exp(-inf -
# (-inf)) and makes NaN rows that the arithmetic keeps finite, in fp32 and under autocast
# Where: pytorch/pytorch#127055, fixed by #130014 (in 2.5, and in 2.4.1 by its cherry-pick).
# Registered in amp-harness harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-08.
# Needs only torch. Run: python sdpa_cpu_masked_key_blocks_give_nan.py
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

# Attention with an additive mask that leaves every query some keys: a sliding window (each query
# sees itself and the 9 before it) over a long sequence, as local attention runs it. A block of
# queries meets whole blocks of masked keys: a kernel that computes exp(-inf - (-inf)) there makes
# NaN rows that IEEE arithmetic keeps finite. Reference: attention written out in float64, finite
# everywhere; every output of the op must be finite, in fp32 and under autocast.
n, heads, width = 640, 2, 8
full = torch.full((n, n), -math.inf)
mask = torch.triu(full, diagonal=1) + torch.tril(full, diagonal=-10)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, heads, n, width, generator=g) for _ in range(3))
scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(width) + mask.double()
assert torch.matmul(torch.softmax(scores, -1), v.double()).isfinite().all()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


outcome = {}
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = attention(q, k, v)
    bad = int((~out.isfinite()).any(-1).sum())
    outcome[str(dtype)] = f"{bad} of {heads * n} rows non-finite" if bad else "finite"
print(f"a sliding-window mask over {n} positions, CPU attention: {outcome}")
sys.exit(0 if all(v == "finite" for v in outcome.values()) else 1)
