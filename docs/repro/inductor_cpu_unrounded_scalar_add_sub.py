# Reproduces inductor-cpu-unrounded-scalar-add-sub (torch 2.4 to before 2.14, fixed in 2.14; cpu).
# Inductor adds or subtracts a Python scalar to a bf16/fp16 tensor on the CPU with the scalar
# unrounded in fp32, where CPU eager rounds it to the tensor's dtype: at the boundary, clamp_min(h
# + S, 0) and margin_ranking_loss(margin=S) drop their gradient (silently zero) and relu(h - S)
# lets an element through
# Where: pytorch/pytorch#185517; fixed by #185869 / #186818 (add/sub scalars rounded on the CPU).
# Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python inductor_cpu_unrounded_scalar_add_sub.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

import sys

import torch

# An autocast region's bf16/fp16 output shifted by a Python scalar, compiled. CPU eager rounds the
# scalar to the tensor's dtype (1.7 -> 1.703125 in bf16): at h = round(S), relu(h - S) is 0; at
# h = -round(S), clamp_min(h + S, 0) sits on its boundary (and passes its gradient where clamp's
# backward does), as margin_ranking_loss(margin=S) does at h = round(S). A compiler keeping S
# unrounded in fp32 moves them off the boundary: an element let through, a gradient silently
# zeroed (pytorch/pytorch#185517). Reference: eager, the same program uncompiled.
S = 1.7


def program(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.autocast("cpu", dtype=dtype):
        h = x @ torch.eye(x.shape[-1])  # x's values, in the autocast dtype
    ones = torch.ones_like(h[:, 1])
    loss = torch.clamp_min(h[:, 0] + S, 0).sum() + torch.nn.functional.margin_ranking_loss(
        h[:, 1], 0 * ones, ones, margin=S
    )
    return loss, (torch.relu(h[:, 2] - S) > 0).float()


def values(loss: torch.Tensor, mask: torch.Tensor, x: torch.Tensor) -> list[float]:
    (grad,) = torch.autograd.grad(loss, x)
    return [*grad[0, :2].tolist(), *mask.tolist()]


wrong = {}
for dtype in (torch.bfloat16, torch.float16):
    r = torch.tensor(S).to(dtype).item()  # the scalar rounded to the format: the inputs
    x = torch.tensor([[-r, r, r]], requires_grad=True)
    eager = values(*program(x, dtype), x)
    torch._dynamo.reset()
    compiled = values(*torch.compile(program)(x, dtype), x)
    print(f"{dtype}: [d clamp_min(h + {S}, 0) at {-r!r}, d margin_ranking_loss at {r!r}, relu({r!r} - {S}) > 0]: "
          f"compiled {compiled}, eager {eager}")  # fmt: skip
    if compiled != eager:
        wrong[str(dtype)] = compiled
sys.exit(1 if wrong else 0)
