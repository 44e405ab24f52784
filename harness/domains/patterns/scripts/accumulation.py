"""Gradient accumulation under GradScaler, standalone, as the AMP examples write it: each
micro-batch's loss divided by the number of micro-batches, a scaled backward for every one, and
step/update only at the effective batch's end. The scale must stay the same for every
micro-batch, the accumulated gradient (after ``unscale_``) must be the float64 sum of the
micro-batches' own gradients within gamma_(k-1)(2^-24) of their magnitudes (k - 1 fp32 additions,
Higham 4.2; scaling by a power of two is exact), and an inf in any one micro-batch must skip the
step (parameters and optimizer state bitwise untouched) and halve the scale once.

amp-harness writes a failed check's device, dtype and micro-batch with the inf over the defaults
below and keeps the judgement it failed (``harness.domains.patterns.repro``); the model and data
are seeded, as the check builds them. As it lies no micro-batch holds an inf, so the skip
judgement lists what the clean step changed.
"""

import math

import torch
from torch import nn

# -- parameters --
DEVICE = torch.device("cpu")
DTYPE = torch.float16  # the autocast dtype
INF_IN: int | None = None  # the micro-batch whose input holds an inf (None: none)
WIDTH = 16  # the model's width
MICRO = 4  # samples per micro-batch
MICRO_BATCHES = 4  # micro-batches per effective batch
SCALE = 2.0**10  # GradScaler's scale at the start (a power of two)

# -- effective_batch --
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, 1)).to(DEVICE)
params = list(model.parameters())
gen = torch.Generator().manual_seed(3)
batches = []
for i in range(MICRO_BATCHES):
    x, y = torch.randn(MICRO, WIDTH, generator=gen), torch.randn(MICRO, 1, generator=gen)
    if i == INF_IN:
        x[0, 0] = math.inf
    batches.append((x.to(DEVICE), y.to(DEVICE)))


def micro_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # under autocast, / the micro-batches
    with torch.autocast(DEVICE.type, dtype=DTYPE):
        loss = nn.functional.mse_loss(model(x).float(), y)
    return loss / MICRO_BATCHES


own = []  # reference: each micro-batch's gradient from a backward of its own, in float64
for x, y in batches:
    for p in params:
        p.grad = None
    torch.autograd.backward(micro_loss(x, y) * SCALE)
    own.append(torch.cat([p.grad.detach().double().flatten() for p in params if p.grad is not None]) / SCALE)
for p in params:
    p.grad = None
stacked = torch.stack(own).cpu()
reference = stacked.sum(0)
u = 2.0**-24  # float32's unit roundoff
budget = (MICRO_BATCHES - 1) * u / (1 - (MICRO_BATCHES - 1) * u) * stacked.abs().sum(0)  # gamma_(k-1)
opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler(DEVICE.type, init_scale=SCALE, growth_interval=1000)
before = [p.detach().clone() for p in params]
scales = []  # under test: the examples' loop, the scale after each micro-batch's backward
for x, y in batches:
    torch.autograd.backward(scaler.scale(micro_loss(x, y)))
    scales.append(float(scaler.get_scale()))
scaler.unscale_(opt)
accumulated = torch.cat([p.grad.detach().flatten() for p in params if p.grad is not None]).cpu()
scaler.step(opt)
scaler.update()
untouched = all(torch.equal(a, p.detach()) for a, p in zip(before, params, strict=True)) and not opt.state

# -- sum --
changed = [s for s in scales if s != SCALE]
over = (accumulated.double() - reference).abs() > budget
worst = float(((accumulated.double() - reference).abs() / budget.clamp_min(1e-300)).max())
print(f"scales after each micro-batch: {scales} (started at {SCALE})")
print(f"{int(over.sum())} of {over.numel()} gradient elements over their budget (worst {worst:.3g}x)")
measured = len(changed) + int(over.sum())  # micro-batches whose scale changed, elements over budget
allowed = 0

# -- skip --
# reference: an inf in one micro-batch skips the effective batch's step and halves the scale once
problems = []
if not untouched:
    problems.append("the step changed parameters or optimizer state")
if scaler.get_scale() != SCALE * 0.5:
    problems.append(f"scale {SCALE} -> {scaler.get_scale()}, expected x0.5")
print(f"inf in micro-batch {INF_IN}: " + ("; ".join(problems) or "skipped, scale halved"))
measured = len(problems)  # promises broken
allowed = 0
