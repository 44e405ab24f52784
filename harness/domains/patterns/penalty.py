"""Gradient penalty under GradScaler, as the AMP examples write it: the gradients of the *scaled*
loss taken with ``create_graph=True``, unscaled by hand (``1 / scaler.get_scale()``), the penalty
(their norm) computed under autocast and added to the loss, then the usual scaled backward, step
and update.

Two references, neither using the path under test:

- the penalty against float64: the norm of the step's own unscaled gradients, summed in float64.
  The penalty sums n squares in fp32 (autocast runs ``pow`` and ``sum`` in fp32): relative error
  at most gamma_(n+1)(2^-24) (n squares, n - 1 additions, one square root halving the sum's
  relative error; Higham, Accuracy and Stability, 3.1);
- the step against the same step without loss scaling: scaling by a power of two and unscaling by
  hand are exact while nothing overflows or underflows, so on the CPU the parameters' gradients
  must be bit for bit those of the unscaled computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from harness.domains.patterns import problems_claim, skipped_and_halved
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP32
from harness.numerics.tolerance import gamma

WIDTH, BATCH = 16, 8
SCALE = 2.0**10


def _model(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1)).to(device)


def unscale_by_hand(scaled: tuple[torch.Tensor, ...], scale: float) -> list[torch.Tensor]:
    """The examples' ``[p * inv_scale for p in scaled_grad_params]``."""
    inv_scale = 1.0 / scale
    return [g * inv_scale for g in scaled]


def penalty_of(grads: list[torch.Tensor]) -> torch.Tensor:
    """The examples' penalty: the gradients' L2 norm, computed under the caller's autocast."""
    total = torch.zeros((), device=grads[0].device)
    for g in grads:
        total = total + g.pow(2).sum()
    return total.sqrt()


@dataclass(frozen=True)
class PenaltyStep:
    """One penalised step: what it computed, and what it did."""

    penalty: float
    #: the norm of the same unscaled gradients, summed in float64
    penalty_float64: float
    #: gamma_(n+1)(fp32's unit roundoff) times that norm
    penalty_budget: float
    #: the parameters' gradients after ``unscale_`` (float32, flattened in parameter order)
    grads: torch.Tensor
    stepped: bool
    scale_before: float
    scale_after: float
    #: parameters and optimizer state bitwise as before the step
    untouched: bool


def penalised_step(
    device: torch.device, dtype: torch.dtype, scale: float | None = SCALE, inf_in_penalty_grads: bool = False
) -> PenaltyStep:
    """One step of the documented pattern (``scale=None``: the same step without a GradScaler, the
    reference). ``inf_in_penalty_grads`` plants an inf in the first of the gradients the penalty is
    computed from."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=scale or 1.0, growth_interval=1000, enabled=scale is not None)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g).to(device), torch.randn(BATCH, 1, generator=g).to(device)
    params = list(model.parameters())
    with torch.autocast(device.type, dtype=dtype):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaled_grads = torch.autograd.grad(scaler.scale(loss), params, create_graph=True)
    scale_before = float(scaler.get_scale()) if scale is not None else 1.0
    grads = unscale_by_hand(scaled_grads, scale_before)
    if inf_in_penalty_grads:
        grads[0] = grads[0] + torch.where(torch.arange(grads[0].numel(), device=device) == 0, math.inf, 0.0).view_as(
            grads[0]
        )
    with torch.autocast(device.type, dtype=dtype):
        penalty = penalty_of(grads)
        loss = loss + penalty
    flat = torch.cat([gr.detach().double().flatten() for gr in grads])
    n = flat.numel()
    norm64 = float(flat.pow(2).sum().sqrt())
    before = [p.detach().clone() for p in params]
    scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
    scaler.unscale_(opt)
    unscaled = torch.cat([p.grad.detach().flatten() for p in params if p.grad is not None])
    scaler.step(opt)
    scaler.update()
    after = [p.detach() for p in params]
    untouched = all(torch.equal(a, b) for a, b in zip(before, after, strict=True)) and not any(
        s.get("momentum_buffer") is not None for s in opt.state.values()
    )
    return PenaltyStep(
        float(penalty.detach()),
        norm64,
        gamma(n + 1, FP32.unit_roundoff) * norm64 if math.isfinite(norm64) else math.inf,
        unscaled.cpu(),
        stepped=not all(torch.equal(a, b) for a, b in zip(before, after, strict=True)),
        scale_before=scale_before,
        scale_after=float(scaler.get_scale()) if scale is not None else 1.0,
        untouched=untouched,
    )


# -- the claims: each check's verdict, decided here -------------------------------------------------
def penalty_claim(step: PenaltyStep) -> ClaimComparison:
    """The penalty, computed from the unscaled gradients in fp32, is within gamma_(n+1)(2^-24) of
    the float64 norm of the same gradients (Higham 3.1)."""
    error = abs(step.penalty - step.penalty_float64)
    return compare_claim(
        "gradient_penalty.penalty_error",
        error,
        error <= step.penalty_budget,
        "|penalty - float64 norm of the same unscaled gradients| <= gamma_(n+1)(2^-24) x that norm (the "
        "penalty sums n squares in fp32, Higham 3.1)",
        detail=f"penalty {step.penalty!r} against float64 {step.penalty_float64!r}: error {error:.3g} over the "
        f"budget {step.penalty_budget:.3g}: the penalty was not computed in fp32 from the unscaled gradients",
        expected=step.penalty_float64,
        allowance=step.penalty_budget,
    )


def unscaled_claim(scaled: PenaltyStep, plain: PenaltyStep) -> ClaimComparison:
    """The penalised step's gradients after ``unscale_`` equal, bit for bit, those of the same step
    with no GradScaler (scaling by a power of two and unscaling by hand are exact)."""
    differ = int((scaled.grads != plain.grads).sum())
    worst = float((scaled.grads - plain.grads).abs().max())
    return compare_claim(
        "gradient_penalty.grads_differing_from_the_unscaled_step",
        differ,
        differ == 0,
        "the parameters' gradients after unscale_ equal, bit for bit, those of the same penalised step with no "
        "GradScaler (scaling by a power of two and unscaling by hand are exact)",
        detail=f"{differ} of {plain.grads.numel()} gradient elements differ from the unscaled step's (largest "
        f"difference {worst:.3g}): the penalty's gradients were not unscaled as the loss's were",
        expected=0,
        allowance=0,
        unit="elements",
    )


def overflow_claim(step: PenaltyStep) -> ClaimComparison:
    """An inf in the gradients the penalty is computed from skips the step (parameters and
    optimizer state bitwise untouched) and halves the scale once."""
    return problems_claim(
        "gradient_penalty.overflow_problems",
        skipped_and_halved(step.stepped or not step.untouched, step.scale_before, step.scale_after),
        "an inf in the gradients the penalty is computed from skips the step (parameters and optimizer state "
        "bitwise untouched) and halves the scale once",
    )
