"""Gradient accumulation under GradScaler, as the AMP examples write it: each micro-batch's loss
divided by the number of micro-batches, ``scaler.scale(loss).backward()`` for every one, and
``step``/``update``/``zero_grad`` only at the effective batch's end. The scale must not change
inside an effective batch (the gradients add up under one scale), and an overflow in any
micro-batch skips the whole effective batch's step and backs the scale off once.

Reference for the accumulated gradient: the same micro-batches' gradients, each from a backward of
its own into fresh ``.grad`` (the same AMP computation), summed in float64. Accumulating k of them
in fp32 rounds k - 1 additions: |accumulated - float64 sum| <= gamma_(k-1)(2^-24) x the sum of
their magnitudes (Higham, Accuracy and Stability, 4.2), and scaling by a power of two is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from harness.numerics.formats import FP32
from harness.numerics.tolerance import gamma

WIDTH, MICRO, MICRO_BATCHES = 16, 4, 4
SCALE = 2.0**10


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, 1)).to(device)


def _batches(device: torch.device, inf_in: int | None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    out = []
    for i in range(MICRO_BATCHES):
        x, y = torch.randn(MICRO, WIDTH, generator=g), torch.randn(MICRO, 1, generator=g)
        if i == inf_in:
            x[0, 0] = math.inf
        out.append((x.to(device), y.to(device)))
    return out


def micro_loss(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """One micro-batch's loss under autocast, divided by the number of micro-batches (the examples' form)."""
    with torch.autocast(device.type, dtype=dtype):
        loss = nn.functional.mse_loss(model(x).float(), y)
    return loss / MICRO_BATCHES


def accumulate(
    model: nn.Module,
    scaler: torch.amp.GradScaler,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> list[float]:
    """The examples' inner loop over one effective batch, up to (not including) the step: the
    scale after each micro-batch's backward."""
    scales = []
    for x, y in batches:
        scaler.scale(micro_loss(model, x, y, device, dtype)).backward()  # type: ignore[no-untyped-call]
        scales.append(float(scaler.get_scale()))
    return scales


@dataclass(frozen=True)
class Accumulated:
    """One effective batch of accumulation, and its step."""

    #: the scale after each micro-batch's backward, and the scale the effective batch started with
    scales: tuple[float, ...]
    scale_start: float
    scale_after_update: float
    #: the accumulated gradient after unscale_, and the float64 sum of the micro-batches' own
    #: gradients (unscaled), with the accumulation budget, flattened in parameter order
    accumulated: torch.Tensor
    reference: torch.Tensor
    budget: torch.Tensor
    stepped: bool
    untouched: bool


def effective_batch(device: torch.device, dtype: torch.dtype, inf_in: int | None = None) -> Accumulated:
    """One effective batch of ``MICRO_BATCHES`` micro-batches, then step and update (``inf_in``: an
    inf planted in that micro-batch's input)."""
    batches = _batches(device, inf_in)
    model = _model(device)
    params = list(model.parameters())
    own = []
    for x, y in batches:  # the reference: each micro-batch's gradient from its own backward
        for p in params:
            p.grad = None
        micro_loss(model, x, y, device, dtype).mul(SCALE).backward()  # type: ignore[no-untyped-call]
        own.append(torch.cat([p.grad.detach().double().flatten() for p in params if p.grad is not None]) / SCALE)
        for p in params:
            p.grad = None
    stacked = torch.stack(own).cpu()
    reference = stacked.sum(0)
    budget = gamma(MICRO_BATCHES - 1, FP32.unit_roundoff) * stacked.abs().sum(0)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE, growth_interval=1000)
    before = [p.detach().clone() for p in params]
    scales = accumulate(model, scaler, batches, device, dtype)
    scaler.unscale_(opt)
    accumulated = torch.cat([p.grad.detach().flatten() for p in params if p.grad is not None]).cpu()
    scaler.step(opt)
    scaler.update()
    after = [p.detach() for p in params]
    same = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    return Accumulated(
        tuple(scales),
        SCALE,
        float(scaler.get_scale()),
        accumulated,
        reference,
        budget,
        stepped=not same,
        untouched=same and not opt.state,
    )
