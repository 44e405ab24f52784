"""GradScaler's recorded hazards, standalone, each a finding the suite keeps (the script exits 1
when the finding no longer holds: the stack changed, update the finding), and its capped growth:

- zero_scale: consecutive overflows from 2^16 at backoff 0.5 take the float32 scale to exactly 0
  (no floor); the next clean step unscales by 1/0, after the inf check, and writes NaN;
- tiny_scale: below 2^-128, 1/scale is inf in float32: a clean step writes inf;
- nan_loss: a loss NaN through a detached term, its gradients finite, is stepped on (GradScaler
  inspects gradients only);
- capped_growth: a growth that would overflow float32 (2^126 x 4) is skipped.

amp-harness writes a failed check's device and scaler over the defaults below
(``harness.domains.scaler.repro``). As it lies every finding holds on torch's GradScaler on the CPU.
"""

import math
from typing import Any

import torch
import torch.distributed as dist

# -- scaler_module --
import torch.amp  # isort: skip  (the module of the scaler under test)

# -- group --
if not dist.is_initialized():  # a sharded scaler needs a process group: one process, in memory
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]

# -- parameters --
SCALER: Any = torch.amp.GradScaler  # the scaler under test
DEVICE = "cpu"
CAPPED = True  # the release caps growth at float32's top (False: a registered known issue leaves it uncapped)


def update(scaler: Any, opt: torch.optim.Optimizer, p: torch.nn.Parameter, overflow: bool) -> None:
    torch.autograd.backward(scaler.scale(p.sum() if overflow else (p * p).sum()))
    if overflow and p.grad is not None:
        p.grad.view(-1)[0] = math.inf
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


# -- zero_scale --
scaler = SCALER(DEVICE)
p = torch.nn.Parameter(torch.ones(4, device=DEVICE))
opt = torch.optim.SGD([p], lr=0.1)
n = 0
s = 2.0**16
while s > 0:  # the rule: backoff 0.5 with no floor, in float32
    s, n = float(torch.tensor(s * 0.5, dtype=torch.float32)), n + 1
for _ in range(n):
    update(scaler, opt, p, overflow=True)
at_zero = scaler.get_scale()
update(scaler, opt, p, overflow=False)
corrupted = bool(p.detach().isnan().any())
print(f"after {n} overflows the scale is {at_zero}; the next clean step wrote NaN: {corrupted}")
measured = int(at_zero != 0.0) + int(not corrupted)  # findings that no longer hold
allowed = 0

# -- tiny_scale --
scaler = SCALER(DEVICE)
p = torch.nn.Parameter(torch.ones(4, device=DEVICE))
opt = torch.optim.SGD([p], lr=0.1)
torch.autograd.backward(scaler.scale(p.sum()))
scaler.step(opt)
scaler.update(2.0**-130)
opt.zero_grad()
update(scaler, opt, p, overflow=False)
corrupted = not bool(p.detach().isfinite().all())
print(f"after update(2^-130) a clean step wrote inf into the parameters: {corrupted}")
measured = int(not corrupted)  # the finding no longer holds
allowed = 0

# -- nan_loss --
scaler = SCALER(DEVICE)
p = torch.nn.Parameter(torch.ones(4, device=DEVICE))
opt = torch.optim.SGD([p], lr=0.1)
loss = (p * p).sum() + torch.tensor(math.nan, device=DEVICE).detach()
before = p.detach().clone()
torch.autograd.backward(scaler.scale(loss))
scaler.step(opt)
scaler.update()
taken = not torch.equal(before, p.detach())
print(f"a NaN loss with finite gradients was stepped on: {taken}")
measured = int(not taken)  # the finding no longer holds
allowed = 0

# -- capped_growth --
p = torch.nn.Parameter(torch.ones(2, device=DEVICE))
opt = torch.optim.SGD([p], lr=0.0)
scaler = SCALER(DEVICE, init_scale=2.0**126, growth_factor=4.0, growth_interval=1)
for _ in range(2):
    update(scaler, opt, p, overflow=False)
expected = 2.0**126 if CAPPED else math.inf  # 2^128 overflows float32: the growth is skipped (or inf, uncapped)
print(f"scale {scaler.get_scale()}, expected {expected}")
measured = int(scaler.get_scale() != expected)  # the scale unlike the rule's
allowed = 0
