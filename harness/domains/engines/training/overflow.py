"""Overflow handling on the user's own setup: a non-finite gradient element planted in a real run.

A run whose steps never overflow never shows what the user's optimizer does with a loss scaler's
``found_inf``: a fused optimizer (``_step_supports_amp_scaling``) receives it and must skip inside
its own kernel, a foreach or custom one is skipped by the scaler, and neither path is exercised by
a clean run. So the recipe is run once more on seed 0 with one non-finite element (+inf, NaN,
-inf in turn) written into one parameter's scaled gradient at up to three checkpoint steps (the
first, middle and last; after the backward pass, before unscaling, clipping and the step), with the
user's model, optimizer and scaler as given. At each such step parameters, optimizer state and step
counts must be bitwise as they were and the scale multiplied by the scaler's backoff factor
(:func:`judge`). The cost is one training run of the recipe, plus copies of the training state
around each planted step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from harness.domains.engines.state import differences
from harness.domains.engines.training.loop import State, train
from harness.domains.engines.training.recipes import INIT_SEED, Recipe, Setup
from harness.numerics.comparison import ClaimComparison, compare_claim

#: Changes named in a failure message; the rest are counted.
SHOWN = 5
#: The non-finite values planted, in turn: each is a way a real overflow shows in a gradient.
VALUES = (math.inf, math.nan, -math.inf)


@dataclass(frozen=True)
class Planted:
    """Where a non-finite gradient element was written: the step, the parameter, the element."""

    step: int
    parameter: str
    element: int
    value: float


@dataclass(frozen=True)
class OverflowStep:
    """What one planted step did: what it changed that it must not have, and the scale."""

    planted: Planted
    changed: tuple[str, ...]
    scale_before: float
    scale_after: float
    backoff: float

    @property
    def label(self) -> str:
        """The planted value as messages say it: +inf, NaN or -inf."""
        return "NaN" if math.isnan(self.planted.value) else f"{self.planted.value:+}"

    @property
    def backed_off(self) -> bool:
        return self.scale_after == self.scale_before * self.backoff


def steps(setup: Setup) -> list[int]:
    """The checkpoint steps planted (the first, middle and last after step 0; at most three)."""
    points = [t for t in setup.checkpoints() if t > 0]
    if not points:
        return []
    return sorted({points[0], points[len(points) // 2], points[-1]})


def run(setup: Setup, recipe: Recipe, device: torch.device | str = "cpu") -> list[OverflowStep]:
    """The recipe on seed 0 with a non-finite gradient element planted at :func:`steps` (the
    first, middle and last parameter with a gradient, its middle element), and what each did."""
    if not recipe.scaler:
        raise ValueError(f"recipe {recipe.name!r} has no loss scaler: nothing skips an overflowed step")
    dev = torch.device(device)
    names = [n for n, p in setup.model(INIT_SEED).named_parameters() if p.requires_grad]
    at = steps(setup)
    planted: dict[int, Planted] = {}

    def planter(step: int, k: int) -> Callable[[Sequence[nn.Parameter]], None]:
        def write(params: Sequence[nn.Parameter]) -> None:
            with_grad = [i for i, p in enumerate(params) if p.grad is not None and p.grad.numel()]
            if not with_grad:
                raise ValueError(f"{setup.name}: no parameter has a gradient at step {step}")
            i = with_grad[[0, len(with_grad) // 2, -1][k % 3]]
            grad = params[i].grad
            assert grad is not None
            element = grad.numel() // 2
            grad.view(-1)[element] = VALUES[k % 3]
            planted[step] = Planted(step, names[i], element, VALUES[k % 3])

        return write

    plant = {t: planter(t, k) for k, t in enumerate(at)}
    keep = frozenset({t - 1 for t in at} | set(at))
    result = train(setup, recipe, seed=0, device=dev, keep_states_at=keep, plant=plant)
    backoff = float(setup.make_scaler(dev.type).get_backoff_factor())
    return [_observe(planted[t], result.states[t - 1], result.states[t], names, backoff) for t in at]


def _observe(planted: Planted, before: State, after: State, names: list[str], backoff: float) -> OverflowStep:
    state_before = before.optimizer.get("state", {})
    state_after = after.optimizer.get("state", {})
    changed = differences(
        [before.model[n] for n in names], [after.model[n] for n in names], state_before, state_after, names
    )
    assert before.scale is not None and after.scale is not None
    return OverflowStep(planted, tuple(changed), float(before.scale), float(after.scale), backoff)


def judge(setup_name: str, recipe: Recipe, step: OverflowStep) -> ClaimComparison:
    """An overflowed step must change nothing and back the scale off (one verdict per step)."""
    p = step.planted
    detail = [f"changed {what}" for what in step.changed[:SHOWN]]
    if len(step.changed) > SHOWN:
        params = sum(what.startswith("parameter ") for what in step.changed)
        detail.append(
            f"... and {len(step.changed) - SHOWN} more: {params} parameters and "
            f"{len(step.changed) - params} optimizer state entries changed in all"
        )
    if not step.backed_off:
        detail.append(
            f"the scale went {step.scale_before:g} -> {step.scale_after:g}, expected x {step.backoff:g} "
            f"= {step.scale_before * step.backoff:g}"
        )
    return compare_claim(
        f"{setup_name}.{recipe.metric_id}.overflow_step_{p.step}",
        len(step.changed) + (not step.backed_off),
        not detail,
        f"{step.label} planted in element {p.element} of {p.parameter}'s gradient at step {p.step}: parameters, "
        "optimizer state and step counts bitwise unchanged, and the scale x the scaler's backoff factor",
        detail=detail or f"nothing changed, the scale went {step.scale_before:g} -> {step.scale_after:g}",
        expected=0,
        allowance=0,
        unit="violations",
    )
