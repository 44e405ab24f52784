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
