# Reproduces inductor-fp8-cast-saturates (torch 2.11 on, open (last verified 2.11); cuda).
# Inductor's generated cast to float8 on CUDA (Triton's conversion) saturates: values beyond the
# format's largest finite value, inf included, become +-448 (e4m3fn) or +-57344 (e5m2), where
# eager's cast gives NaN (e4m3fn) or inf (e5m2); the same tensor cast in a compiled and an eager
# region disagrees exactly at overflow, where a delayed-scaling recipe's amax history would have
# told the overflow apart
# Where: pytorch/ao#1912 (eager unsaturated, Triton saturated); pytorch/pytorch#178817 (eager e4m3
# casts). Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-04.
# Needs only torch. Run: python inductor_fp8_cast_saturates.py
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

# Casting to float8 must give the same bits compiled and eager. Eager overflows (e4m3fn: NaN, e5m2:
# inf); Inductor's CUDA cast (Triton) saturates at the largest finite value. Reference: eager's cast.
# Runs on CUDA where there is one (the device); on the CPU it shows what the CPU does.
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.tensor([1.0, 1000.0, 3.0e38, math.inf, -1000.0, -math.inf], device=device)


def cast(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float8_e4m3fn)


eager = cast(x)
compiled = torch.compile(cast)(x)
e_bits, c_bits = eager.view(torch.uint8).tolist(), compiled.view(torch.uint8).tolist()
differ = [(float(v), hex(e), hex(c)) for v, e, c in zip(x.tolist(), e_bits, c_bits, strict=True) if e != c]
print(f"fp32 -> float8_e4m3fn on {device}, eager vs compiled bits (input, eager, compiled): {differ or 'all equal'}")
sys.exit(1 if differ else 0)
