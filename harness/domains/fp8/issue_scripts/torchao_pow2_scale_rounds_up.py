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
