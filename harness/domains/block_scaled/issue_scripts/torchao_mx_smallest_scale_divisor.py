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
