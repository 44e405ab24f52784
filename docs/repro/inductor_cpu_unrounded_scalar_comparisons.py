# Reproduces inductor-cpu-unrounded-scalar-comparisons (torch 2.4 to before 2.12, fixed in 2.12; cpu, cuda).
# Inductor compares a bf16/fp16 tensor with a Python scalar kept unrounded in fp32, where eager
# rounds the scalar to the tensor's dtype first: at the rounded scalar, h > S and h == S give the
# opposite answers (a threshold on an autocast output lets other elements through compiled)
# Where: pytorch/pytorch#128306 (CPU AMP threshold), #173987; fixed by #175807 (comparison scalars
# rounded). Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python inductor_cpu_unrounded_scalar_comparisons.py
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

# An autocast region's bf16/fp16 output compared with a Python scalar, compiled. Eager rounds the
# scalar to the tensor's dtype first (1.7 -> 1.703125 in bf16), so an element equal to the rounded
# scalar is == S and not > S. A compiler keeping the scalar unrounded in fp32 says the opposite.
# Reference: eager, the same program uncompiled.
S = 1.7


def program(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast("cpu", dtype=dtype):
        h = x @ torch.eye(x.shape[-1])  # x's values, in the autocast dtype
    return torch.stack([h[0, 0] > S, h[0, 0] == S])


wrong = {}
for dtype in (torch.bfloat16, torch.float16):
    r = torch.tensor(S).to(dtype).item()  # the scalar rounded to the format: the input
    x = torch.tensor([[r]])
    eager = program(x, dtype).tolist()
    torch._dynamo.reset()
    compiled = torch.compile(program)(x, dtype).tolist()
    print(f"{dtype}: h = {r!r}: (h > {S}, h == {S}) compiled {compiled}, eager {eager}")
    if compiled != eager:
        wrong[str(dtype)] = compiled
sys.exit(1 if wrong else 0)
