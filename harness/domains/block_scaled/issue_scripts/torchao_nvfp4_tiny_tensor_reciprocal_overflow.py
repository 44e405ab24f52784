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
