"""Gradient penalty under GradScaler, standalone, as the AMP examples write it: the gradients of
the scaled loss taken with ``create_graph=True``, unscaled by hand, their norm computed under
autocast and added to the loss, then the scaled backward, step and update. The penalty must be
within gamma_(n+1)(2^-24) of the float64 norm of the same gradients (Higham 3.1), the parameters'
gradients after ``unscale_`` must equal bit for bit those of the same step without a GradScaler
(scaling by a power of two and unscaling by hand are exact), and an inf in the gradients the
penalty is computed from must skip the step and halve the scale once.

amp-harness writes a failed check's device and dtype over the defaults below and keeps the
judgement it failed (``harness.domains.patterns.repro``); the model and data are seeded, as the
check builds them. As it lies it runs every judgement on the CPU in bf16.
"""

import math
from typing import Any

import torch
from torch import nn

# -- parameters --
DEVICE = torch.device("cpu")
DTYPE = torch.bfloat16  # the autocast dtype
WIDTH = 16  # the model's width
BATCH = 8  # samples in the batch
SCALE = 2.0**10  # GradScaler's scale (a power of two)

# -- step --


def step(scale: float | None, inf_in_penalty_grads: bool = False) -> dict[str, Any]:
    """One penalised step (``scale`` None: without GradScaler, the reference)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=scale or 1.0, growth_interval=1000, enabled=scale is not None)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g).to(DEVICE), torch.randn(BATCH, 1, generator=g).to(DEVICE)
    params = list(model.parameters())
    with torch.autocast(DEVICE.type, dtype=DTYPE):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaled_grads = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
    scale_before = float(scaler.get_scale()) if scale is not None else 1.0
    grads = [gr * (1.0 / scale_before) for gr in scaled_grads]  # unscaled by hand, as the examples do
    if inf_in_penalty_grads:
        grads[0] = grads[0] + torch.where(torch.arange(grads[0].numel(), device=DEVICE) == 0, math.inf, 0.0).view_as(
            grads[0]
        )
    with torch.autocast(DEVICE.type, dtype=DTYPE):
        total = torch.zeros((), device=DEVICE)
        for gr in grads:
            total = total + gr.pow(2).sum()
        penalty = total.sqrt()
        loss = loss + penalty
    flat = torch.cat([gr.detach().double().flatten() for gr in grads])  # reference: the norm in float64
    before = [p.detach().clone() for p in params]
    torch.autograd.backward(scaler.scale(loss))
    scaler.unscale_(opt)
    unscaled = torch.cat([p.grad.detach().flatten() for p in params if p.grad is not None]).cpu()
    scaler.step(opt)
    scaler.update()
    changed = not all(torch.equal(a, p.detach()) for a, p in zip(before, params, strict=True))
    state = any(s.get("momentum_buffer") is not None for s in opt.state.values())
    return {
        "penalty": float(penalty.detach()),
        "norm64": float(flat.pow(2).sum().sqrt()),
        "n": flat.numel(),
        "grads": unscaled,
        "touched": changed or state,
        "scale_before": scale_before,
        "scale_after": float(scaler.get_scale()) if scale is not None else 1.0,
    }


# -- penalty --
s = step(SCALE)
n, u = s["n"], 2.0**-24  # float32's unit roundoff
budget = (n + 1) * u / (1 - (n + 1) * u) * s["norm64"]  # gamma_(n+1) x the norm
print(f"penalty {s['penalty']!r}, float64 norm {s['norm64']!r}: error {abs(s['penalty'] - s['norm64']):.3g}")
measured = abs(s["penalty"] - s["norm64"])  # the penalty's error against the float64 norm
allowed = budget

# -- unscaled --
scaled, plain = step(SCALE), step(None)
differ = int((scaled["grads"] != plain["grads"]).sum())
print(f"{differ} of {plain['grads'].numel()} gradient elements differ from the step without GradScaler")
measured = differ  # gradient elements unlike the unscaled step's, bit for bit
allowed = 0

# -- skip --
s = step(SCALE, inf_in_penalty_grads=True)
problems = []
if s["touched"]:
    problems.append("the step changed parameters or optimizer state")
if s["scale_after"] != s["scale_before"] * 0.5:
    problems.append(f"scale {s['scale_before']} -> {s['scale_after']}, expected x0.5")
print("inf in the penalty's gradients: " + ("; ".join(problems) or "skipped, scale halved"))
measured = len(problems)  # promises broken
allowed = 0
