# Reproduces torchao-nvfp4-tiny-tensor-reciprocal-overflow (torchao 0.17 on, open (last verified 0.18); cpu, cuda).
# NVFP4Tensor.to_nvfp4 multiplies the elements by (1 / per_tensor_scale) / block_scale in float32:
# for a tensor whose amax is below about 2688 x 2^-128 (1e-35, an underflowed gradient) the
# per-tensor scale is below 2^-128, its reciprocal overflows to inf, every nonzero element
# saturates to +-6 and every zero becomes 0 x inf = NaN, stored as the code of +-1.5: zeros
# dequantise to nonzero values
# Where: torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize (reciprocal_scale).
# Registered in amp-harness harness/domains/block_scaled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen3-f25m1-avx2-t2,
# amp-harness 0.1.0, 2026-12-06.
# Needs only torch and torchao. Run: python torchao_nvfp4_tiny_tensor_reciprocal_overflow.py
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
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

# NVFP4 with a per-tensor scale (amax / (448 x 6)): a tensor whose largest value is 2^-119 (an
# underflowing gradient) beside zeros. Its per-tensor scale 2^-119 / 2688 is a float32 subnormal;
# dequantised, the zeros must stay zeros and 2^-121 (1.5 in e2m1 units of its block) must come back
# closer to itself than to e2m1's neighbours 1 and 2. Reference: the input.
x = torch.zeros(1, 32)
x[0, 0] = 2.0**-119
x[0, 1] = 2.0**-121
per_tensor_scale = per_tensor_amax_to_scale(x.abs().max())
q = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_scale)
back = q.dequantize(torch.float32)
zeros_wrong = int((back[0, 2:] != 0).sum())
ratio = back[0, 1].item() / x[0, 1].item()
print(
    f"per-tensor scale {float(per_tensor_scale)!r}: {zeros_wrong} of 30 zeros dequantise nonzero "
    f"(e.g. {back[0, 2].item()!r}, allowed 0); 2^-121 comes back x{ratio!r} (allowed 5/6 to 7/6: "
    "half the way to e2m1's neighbours of 1.5)"
)
sys.exit(1 if zeros_wrong or not 5 / 6 <= ratio <= 7 / 6 else 0)
