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
from typing import Any

import torch
from torch import nn

from harness.domains.patterns import problems_claim, skipped_and_halved
from harness.numerics.comparison import ClaimComparison, compare_claim
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


# -- the claims: each check's verdict, decided here -------------------------------------------------
@dataclass(frozen=True)
class SumClaims:
    """The effective batch's two claims, and the accumulated gradient's worst element in units of
    its budget (a row's tag)."""

    scale: ClaimComparison
    total: ClaimComparison
    worst: float


def sum_claims(run: Accumulated) -> SumClaims:
    """One scale for every micro-batch of the effective batch, and the accumulated gradient within
    gamma_(k-1)(2^-24) x the micro-batches' magnitudes of their float64 sum."""
    changed = [s for s in run.scales if s != run.scale_start]
    error = (run.accumulated.double() - run.reference).abs()
    over = error > run.budget
    worst = float((error / run.budget.clamp_min(1e-300)).max())
    scale = compare_claim(
        "accumulation.scale_changes_inside_the_effective_batch",
        len(changed),
        not changed,
        "the scale stays the same for every micro-batch of an effective batch (update only at its end)",
        detail=f"scales after each micro-batch: {list(run.scales)}, the effective batch started at {run.scale_start}",
        expected=0,
        allowance=0,
        unit="micro-batches",
    )
    total = compare_claim(
        "accumulation.elements_over_budget",
        int(over.sum()),
        not bool(over.any()),
        "|accumulated gradient - float64 sum of the micro-batches' own gradients| <= gamma_(k-1)(2^-24) x the "
        "sum of their magnitudes (k micro-batches accumulated in fp32, Higham 4.2)",
        detail=f"{int(over.sum())} of {over.numel()} gradient elements over their budget (worst {worst:.3g}x): the "
        "micro-batches' gradients were not summed under one scale",
        expected=0,
        allowance=0,
        unit="elements",
    )
    return SumClaims(scale, total, worst)


def overflow_claim(run: Accumulated, inf_in: int) -> ClaimComparison:
    """An inf in micro-batch ``inf_in`` skips the effective batch's step (parameters and optimizer
    state bitwise untouched) and halves the scale once."""
    problems = skipped_and_halved(run.stepped or not run.untouched, run.scale_start, run.scale_after_update)
    return problems_claim(
        "accumulation.overflow_problems",
        problems,
        "an inf in one micro-batch skips the effective batch's step (parameters and optimizer state bitwise "
        "untouched) and halves the scale once",
        f"inf in micro-batch {inf_in}",
    )


def no_sync_claim(clean: list[dict[str, Any]]) -> ClaimComparison:
    """Under DDP's ``no_sync()`` on all but the last micro-batch (``clean``: each rank's clean case
    from ``rank_programs.ddp_no_sync_accumulation``): one scale per effective batch on every rank,
    the same synchronised gradient on every rank, within gamma_(k+world-2)(2^-24) of the float64
    average of the ranks' sums of their micro-batches' own gradients (k - 1 additions on each
    rank, world - 1 in the all-reduce; dividing by world is exact)."""
    world = len(clean)
    reference = torch.tensor([c["own_sum"] for c in clean]).mean(0)
    magnitude = torch.tensor([c["own_abs_sum"] for c in clean]).mean(0)
    budget = gamma(MICRO_BATCHES + world - 2, FP32.unit_roundoff) * magnitude
    problems = [f"rank {r}: scales {c['scales']}" for r, c in enumerate(clean) if len(set(c["scales"])) != 1]
    grads = [torch.tensor(c["grads"]) for c in clean]
    problems += [
        f"rank {r}'s gradients differ from rank 0's" for r in range(1, world) if not torch.equal(grads[r], grads[0])
    ]
    over = int(((grads[0] - reference).abs() > budget).sum())
    if over:
        worst = float(((grads[0] - reference).abs() / budget.clamp_min(math.ulp(0.0))).max())
        problems.append(f"{over} of {reference.numel()} gradient elements over budget (worst {worst:.3g}x)")
    return problems_claim(
        "accumulation.no_sync.problems",
        problems,
        "under no_sync() on all but the last micro-batch: one scale per effective batch on every rank, the same "
        "synchronised gradient on every rank, within gamma_(k+world-2)(2^-24) of the float64 average of the "
        "ranks' sums of their micro-batches' own gradients",
    )


def no_sync_overflow_claim(seen: list[dict[str, Any]], case: list[int]) -> ClaimComparison:
    """An inf on rank ``case[0]``'s micro-batch ``case[1]`` (inside ``no_sync`` or in the
    synchronised one) skips the step on every rank and halves every rank's scale once."""
    problems = [f"rank {r} stepped" for r, s in enumerate(seen) if s["stepped"] or s["momentum"]]
    problems += [
        f"rank {r}: scale {s['scales'][0]} -> {s['scale_after']}, expected x0.5"
        for r, s in enumerate(seen)
        if s["scale_after"] != s["scales"][0] * 0.5
    ]
    return problems_claim(
        "accumulation.no_sync.overflow_problems",
        problems,
        "an inf in one rank's micro-batch (inside no_sync or in the synchronised one) skips the step on every "
        "rank (parameters and momentum untouched) and halves every rank's scale once",
        f"inf on rank {case[0]}, micro-batch {case[1]}",
    )
