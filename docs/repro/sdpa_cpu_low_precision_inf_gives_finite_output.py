# Reproduces sdpa-cpu-low-precision-inf-gives-finite-output (torch 2.9 on, open (last verified 2.15); cpu).
# an inf in one element of a query or a key reaching CPU scaled_dot_product_attention under bf16
# or fp16 autocast at sequence lengths 16 and 64: the rows it overflows come out finite (zeros)
# where fp32 and the arithmetic give NaN, hiding the overflow from the loss
# Where: CPU flash attention's low-precision kernel
# (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp); of the class of pytorch/pytorch#141128 and
# #130014; no report of this case found. Registered in amp-harness
# harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python sdpa_cpu_low_precision_inf_gives_finite_output.py
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

# An inf in one element of a query (or a key) reaching scaled_dot_product_attention under CPU
# autocast: at sequence length 64 (the CPU flash-attention kernel's blocked path) the bf16 and fp16
# kernels give the rows it overflows finite outputs (zeros), where fp32 and the arithmetic give
# NaN (a score of +inf: inf - inf in the softmax). The overflow is hidden from the loss. Reference:
# attention written out in float64 by matmul, exp and sum.


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.matmul(weights / weights.sum(-1, keepdim=True), v.double())


outcome = {}
for overflowed in (0, 1):  # the query, the key
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator().manual_seed(64)
        qkv = [torch.randn(1, 2, 64, 16, generator=g) for _ in range(3)]
        qkv[overflowed][0, 0, 3, 0] = math.inf
        expected = ~reference(*qkv).isfinite()
        with torch.autocast("cpu", dtype=dtype):
            got = ~attend(*qkv).isfinite()
        hidden = int((expected & ~got).sum())
        outcome[f"{'query' if overflowed == 0 else 'key'}, {dtype}"] = f"{hidden} of {int(expected.sum())} hidden"
print(f"an inf in attention's input at length 64 under CPU autocast, non-finite outputs come out finite: {outcome}")
sys.exit(1 if any(not v.startswith("0 of") for v in outcome.values()) else 0)
