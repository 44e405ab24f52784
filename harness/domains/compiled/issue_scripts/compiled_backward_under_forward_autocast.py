import sys

import torch
from torch import nn

# A region with autocast disabled inside an autocast forward runs in fp32; with backward() called
# outside autocast its backward must be fp32 too, compiled as in eager. Reference: the fp32 layer's
# weight gradient, sum over rows of its input h (d sum(out) / d out = 1), in float64 from the h the
# compiled forward itself produced; allowance: float32's evaluation of that sum, gamma_n(2^-24) sum|h|.
torch.manual_seed(0)
ROWS, WIDTH = 64, 64


class Region(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.low, self.fp32 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.low(x)
        with torch.autocast("cpu", enabled=False):
            return h, self.fp32(h.float())


model = Region()
x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(2000))
compiled = torch.compile(model)
with torch.autocast("cpu", dtype=torch.bfloat16):
    h, out = compiled(x)
torch.autograd.backward(out.float().sum())
h64 = h.detach().double()
reference = h64.sum(0).expand(WIDTH, WIDTH)  # d/dW of sum(h W^T + b): every row is sum_i h_i
u = 2.0**-24
gamma = ROWS * u / (1 - ROWS * u)
allowance = gamma * h64.abs().sum(0).expand(WIDTH, WIDTH)
grad = model.fp32.weight.grad
assert grad is not None  # the backward above wrote it
ratio = float(((grad.double() - reference).abs() / allowance).max())
print(f"compiled region's fp32 weight gradient: worst error {ratio:.3g} x its float32 budget (allowed 1)")
sys.exit(1 if ratio > 1 else 0)
