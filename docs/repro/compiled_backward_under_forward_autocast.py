# Reproduces compiled-backward-under-forward-autocast (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# AOTAutograd traces a compiled region's backward under the autocast state of its forward
# (torch._functorch.config.backward_pass_autocast = 'same_as_forward'), so a region with autocast
# disabled inside an autocast forward gets a low-precision backward: its fp32 weight gradients
# differ from eager's (backward called outside autocast) far beyond fp32 rounding. Remedy:
# backward_pass_autocast = 'off'
# Where: pytorch/pytorch#179804, #153044; default deprecated in #177286, 'off' by default from
# #177287. Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python compiled_backward_under_forward_autocast.py
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
