# Reproduces clip-grad-norm-fp16-norm-overflows (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# clip_grad_norm_ of float16 gradients (pure fp16 training, where GradScaler refuses fp16
# gradients) whose total norm exceeds 65504, every element finite: the per-tensor norms come back
# in float16 as inf, the coefficient max_norm / inf is 0 and the gradients are silently zeroed
# (for-loop and foreach alike)
# Where: torch/nn/utils/clip_grad.py (per-tensor norms in the gradients' dtype); no upstream
# report found: found by the harness's low-precision clipping check. Registered in amp-harness
# harness/domains/scaler/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python clip_grad_norm_fp16_norm_overflows.py
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

# torch.nn.utils.clip_grad_norm_ on float16 gradients (pure fp16 training, where GradScaler does
# not apply: it refuses fp16 gradients) whose total norm exceeds float16's largest finite value,
# 65504, though every element is finite: the per-tensor norms are returned in float16, overflow
# to inf, the total norm is inf and the clip coefficient max_norm / inf is 0, so the gradients
# are silently zeroed (the for-loop and foreach implementations alike). Reference: the norm and
# the clipped gradients computed in float64 from the same float16 gradients.


def clip(params: list[torch.nn.Parameter], foreach: bool) -> torch.Tensor:
    return torch.nn.utils.clip_grad_norm_(params, max_norm=1.0, foreach=foreach)


outcome = {}
for foreach in (False, True):
    p = torch.nn.Parameter(torch.zeros(10000, dtype=torch.float16))
    p.grad = torch.full((10000,), 1000.0, dtype=torch.float16)  # each element finite, the norm 1e5
    true_norm = math.sqrt(10000 * 1000.0**2)
    norm = clip([p], foreach)
    expected = 1000.0 / true_norm
    got = float(p.grad[0])
    ok = math.isfinite(float(norm)) and abs(got - expected) <= 2 * 2.0**-11 * expected
    outcome[f"foreach={foreach}"] = f"norm {float(norm)}, clipped grad {got} (float64: {expected:.6g})"
    outcome[f"foreach={foreach}"] += "" if ok else " WRONG"
print(f"clip_grad_norm_(max_norm=1) of float16 gradients whose norm is 1e5: {outcome}")
sys.exit(0 if all(not v.endswith("WRONG") for v in outcome.values()) else 1)
