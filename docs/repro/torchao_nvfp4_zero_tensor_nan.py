# Reproduces torchao-nvfp4-zero-tensor-nan (torchao 0.17 on, open (last verified 0.18); cpu, cuda).
# NVFP4Tensor.to_nvfp4 with the per-tensor scale per_tensor_amax_to_scale gives (amax / 2688)
# divides every block scale by it: for a tensor of zeros that scale is 0, every block scale
# becomes 0/0 = NaN and the tensor dequantises to NaN instead of zeros (an all-zero gradient
# poisons the step; TransformerEngine's and torchao's own Triton 2D quantiser treat a zero global
# amax as scale 1)
# Where: torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize (per_tensor_scale branch).
# Registered in amp-harness harness/domains/block_scaled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen3-f25m1-avx2-t2,
# amp-harness 0.1.0, 2026-12-06.
# Needs only torch and torchao. Run: python torchao_nvfp4_zero_tensor_nan.py
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

# NVFP4 with a per-tensor scale (amax / (448 x 6), as per_tensor_amax_to_scale computes it): a tensor
# of zeros, such as the gradient of an unused path, must dequantise to zeros. Reference: the input
# itself (zeros are exact in every format); allowance: none.
x = torch.zeros(2, 32)
per_tensor_scale = per_tensor_amax_to_scale(x.abs().max())
q = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_scale)
back = q.dequantize(torch.float32)
wrong = int((back != x).sum())  # NaN != 0 counts
print(
    f"zeros through NVFP4 (per-tensor scale {float(per_tensor_scale)!r}): {wrong} of {x.numel()} values "
    f"differ, e.g. {back.flatten()[0].item()!r} (allowed 0)"
)
sys.exit(1 if wrong else 0)
