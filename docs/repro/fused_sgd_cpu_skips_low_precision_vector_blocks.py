# Reproduces fused-sgd-cpu-skips-low-precision-vector-blocks (torch 2.4 to before 2.14, fixed in 2.14; cpu).
# SGD(fused=True) on the CPU leaves every whole SIMD block of a bfloat16 or float16 parameter
# unchanged (only the remainder steps; with momentum the buffer takes garbage too): pure
# low-precision training with fused SGD does not train, silently
# Where: pytorch/pytorch#191763, fixed by pytorch/pytorch#192545
# (aten/src/ATen/native/cpu/FusedSGDKernel.cpp). Registered in amp-harness
# harness/domains/scaler/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python fused_sgd_cpu_skips_low_precision_vector_blocks.py
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

# SGD(fused=True) on the CPU, one step of bf16 and of fp16 parameters (131 elements: whole vector
# blocks of every SIMD width and a remainder) with a gradient of ones. The reference, in float64
# from the same values: p - lr * g. Each new element must be within two roundings of the
# parameter's format of it (the product lr * g and the sum, as the for-loop SGD computes them):
# |p - ref| <= 2 u (|p| + lr |g|), u the format's unit roundoff (2^-8 bf16, 2^-11 fp16).
worst = 0.0
for dtype, u in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
    start = torch.linspace(0.25, 1.0, 131, dtype=torch.float64).to(dtype)
    p = torch.nn.Parameter(start.clone())
    sgd = torch.optim.SGD([p], lr=0.1, fused=True)
    p.grad = torch.ones_like(p)
    sgd.step()
    ref = start.double() - 0.1
    allowed = 2 * u * (start.double().abs() + 0.1)
    ratio = float(((p.detach().double() - ref).abs() / allowed).max())
    unchanged = int((p.detach() == start).sum())
    print(f"{dtype}: {unchanged} of {p.numel()} elements unchanged by the step; worst error {ratio:.3g}x two roundings")
    worst = max(worst, ratio)
print(f"measured = {worst!r} (worst error over two roundings of the format); allowed = 1.0")
sys.exit(0 if worst <= 1.0 else 1)
