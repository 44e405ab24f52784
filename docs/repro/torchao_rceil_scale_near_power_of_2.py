# Reproduces torchao-rceil-scale-near-power-of-2 (torchao 0.17 on, open (last verified 0.18); cpu, cuda).
# MX RCEIL scales compute ceil(log2(amax / elem_max)) in float32 (CPU, eager): when amax /
# elem_max lies just above a power of two, the division or log2 rounds onto it and the e8m0 scale
# is one code below the exact ceiling; the block's largest element then saturates at elem_max (by
# at most float32's rounding)
# Where: torchao/prototype/mx_formats/mx_tensor.py _to_mx_rceil (fallback path). Registered in
# amp-harness harness/domains/block_scaled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen3-f25m1-avx2-t2,
# amp-harness 0.1.0, 2026-12-06.
# Needs only torch and torchao and numpy. Run: python torchao_rceil_scale_near_power_of_2.py
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
from torchao.prototype.mx_formats import config, mx_tensor

# MX RCEIL: the e8m0 block scale is 2^ceil(log2(amax / elem_max)), stored as the biased exponent
# code (bias 127). For a block amax just above elem_max x 2^-100 the exact code is 127 - 100 + 1.
ELEM_MAX = 448.0  # float8_e4m3fn
BLOCK = 32
amax = ELEM_MAX * 2.0**-100 * (1 + 2.0**-23)
x = torch.tensor([amax] + [0.0] * (BLOCK - 1), dtype=torch.float32)
codes, _ = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=config.ScaleCalculationMode.RCEIL)
got = int(codes.view(torch.uint8).flatten()[0])
ratio = amax / ELEM_MAX  # float64, exact: 2^-100 (1 + 2^-23)
m, e = math.frexp(ratio)  # ratio = m 2^e, 0.5 <= m < 1
ceil_log2 = e - 1 if m == 0.5 else e  # the exact ceiling of log2, from the bits
expected = 127 + ceil_log2
print(f"block amax {amax!r}: torchao RCEIL code {got}; exact code {expected} (allowance: exact)")
sys.exit(1 if got != expected else 0)
