# Reproduces inductor-cpu-unrounded-scalar-fmod-remainder (torch 2.4 on, open (last verified 2.15); cpu).
# Inductor takes fmod/remainder of a bf16/fp16 tensor by a Python scalar on the CPU with the
# scalar unrounded in fp32, where CPU eager rounds it to the tensor's dtype: fmod(2 round(S), S)
# is not 0, and remainder's sign correction makes a residue almost a whole modulus
# Where: pytorch/pytorch#186875, open (#186942 proposed; remainder agrees from 2.14, fmod does not
# in 2.15). Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python inductor_cpu_unrounded_scalar_fmod_remainder.py
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

# An autocast region's bf16/fp16 output taken modulo a Python scalar, compiled. CPU eager rounds the
# scalar to the tensor's dtype (1.7 -> 1.703125 in bf16): fmod(2 round(S), S) and
# remainder(-2 round(S), S) are 0. A compiler keeping S unrounded in fp32 leaves a residue, and
# remainder's sign correction makes it almost a whole modulus. Reference: eager, the same program
# uncompiled.
S = 1.7


def program(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast("cpu", dtype=dtype):
        h = x @ torch.eye(x.shape[-1])  # x's values, in the autocast dtype
    return torch.stack([torch.fmod(h[0, 0], S), torch.remainder(h[0, 1], S)]).float()


wrong = {}
for dtype in (torch.bfloat16, torch.float16):
    r = torch.tensor(S).to(dtype).item()  # the scalar rounded to the format: the inputs
    x = torch.tensor([[2 * r, -2 * r]])
    eager = program(x, dtype).tolist()
    torch._dynamo.reset()
    compiled = torch.compile(program)(x, dtype).tolist()
    print(f"{dtype}: [fmod({2 * r!r}, {S}), remainder({-2 * r!r}, {S})]: compiled {compiled}, eager {eager}")
    if compiled != eager:
        wrong[str(dtype)] = compiled
sys.exit(1 if wrong else 0)
