# Reproduces torchao-mx-smallest-scale-divisor (torchao 0.17 on, open (last verified 0.18); cpu, cuda).
# An MX block whose e8m0 scale code is 0 (2^-127: a block amax below about 2^-118 for e4m3
# elements) is stored with that code, but its elements are not divided by 2^-127: FLOOR and CEIL
# clamp the float32 divisor to float32's smallest normal 2^-126 (a workaround for Triton's
# subnormals), so the block decodes to half its values; RCEIL follows TransformerEngine's
# exponent-0 reciprocal of 1, so the block's elements flush to zero
# Where: torchao/prototype/mx_formats/mx_tensor.py to_mx (F32_MIN_NORMAL clamp) and _to_mx_rceil.
# Registered in amp-harness harness/domains/block_scaled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen3-f25m1-avx2-t2,
# amp-harness 0.1.0, 2026-12-06.
# Needs only torch and torchao. Run: python torchao_mx_smallest_scale_divisor.py
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
from torchao.prototype.mx_formats import config, mx_tensor

# MX (OCP Microscaling): a block's e8m0 scale is 2^(code - 127) and its elements are the block's
# values divided by that scale. A block whose only nonzero value is 2^-119 = 256 x 2^-127 gets scale
# code 0 (2^-127) in FLOOR and RCEIL alike, so its e4m3 element must be 256 and decode to 2^-119.
# Reference: the input (2^-119 is exact in float32, in e4m3 x e8m0 and in float64); allowance: none.
BLOCK = 32
value = 2.0**-119
x = torch.tensor([value] + [0.0] * (BLOCK - 1), dtype=torch.float32)
wrong = 0
for mode in (config.ScaleCalculationMode.FLOOR, config.ScaleCalculationMode.RCEIL):
    codes, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=mode)
    code = int(codes.view(torch.uint8).flatten()[0])
    element = float(data.to(torch.float32).flatten()[0])
    decoded = element * 2.0 ** (code - 127)
    print(f"{mode.value}: scale code {code}, element {element!r}, decodes to {decoded!r}; expected {value!r}")
    wrong += decoded != value
sys.exit(1 if wrong else 0)
