# Reproduces torchao-pow2-scale-rounds-up (torchao 0.17 on, open (last verified 0.18); cpu, cuda).
# round_scales_to_power_of_2 computes exp2(floor(log2(scale))) in float32: for a scale within
# float32 log2's rounding of a power of two below it (e.g. 32 (1 - 2^-24)), log2 rounds up to the
# integer and the scale becomes that power of two, one binade above the exact floor; amax x scale
# then exceeds fp8_max by at most that window and rounds to fp8_max
# Where: torchao/float8/float8_utils.py _round_scale_down_to_power_of_2. Registered in amp-harness
# harness/domains/fp8/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-04.
# Needs only torch and torchao. Run: python torchao_pow2_scale_rounds_up.py
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
from torchao.float8 import float8_utils

# torchao's power-of-two scale must be the largest power of two not above the exact scale
# fp8_max / amax (rounding the scale down keeps amax x scale <= fp8_max). For an amax whose exact
# scale is just below 32, that power is 16.
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
amax = FP8_MAX / (32.0 * (1 - 2.0**-24))
exact_scale = FP8_MAX / amax  # float64: 32 (1 - 2^-24), exact
m, e = math.frexp(exact_scale)  # exact_scale = m 2^e, 0.5 <= m < 1
expected = 2.0 ** (e - 1)  # the power-of-two floor, from the bits: no log2 rounding
got = float(float8_utils.amax_to_scale(torch.tensor(amax), torch.float8_e4m3fn, round_scales_to_power_of_2=True))
print(f"amax {amax!r}: torchao scale {got!r}; exact power-of-two floor {expected!r} (allowance: exact)")
sys.exit(1 if got != expected else 0)
