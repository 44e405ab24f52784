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
