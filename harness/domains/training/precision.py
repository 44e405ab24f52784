"""The precision lane: fp32 training against an fp64 run of the same recipe, so that a precision
regression shared by fp32 and AMP (an optimizer losing precision in its update, a kernel that
changed for every dtype) fails even where parity (AMP against fp32 on the same stack) cannot see
it and the stack's golden curves are new.

The allowance calibrates itself, as Dynamo's ``same()`` judges compiled error against eager's own
error: fp32's distance from the fp64 trajectory, ``D32 = max_t |L_fp32(t) - L_fp64(t)|`` over the
evaluation checkpoints, may be at most ``PRECISION_FRACTION`` of bf16 autocast's distance from the
same fp64 run, ``Dbf16``. Maxima over checkpoints, not per-checkpoint ratios: where two
trajectories happen to cross, a per-checkpoint distance is near 0.

``PRECISION_FRACTION = sqrt(u_fp32 / u_bf16) = 2^-8``: the geometric midpoint between "fp32's
error scales with its unit roundoff" (2^-16 of bf16's) and "fp32 as far off as bf16" (1). A
regression that costs fp32 about half of the 16 bits it has over bf16 fails. Measured error rates
are in :mod:`harness.domains.training.rates` and the README.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.domains.training.batches import tree_map
from harness.domains.training.loop import Run, train
from harness.domains.training.recipes import BF16, FP32, Recipe, Setup
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import BF16 as BF16_FORMAT
from harness.numerics.formats import FP32 as FP32_FORMAT

PRECISION_FRACTION = math.sqrt(FP32_FORMAT.unit_roundoff / BF16_FORMAT.unit_roundoff)


def fp64_setup(setup: Setup) -> Setup:
    """The same problem in float64: model, floating inputs and targets (token ids untouched)."""

    def model(seed: int, _make: Any = setup.model) -> torch.nn.Module:
        return _make(seed).double()  # type: ignore[no-any-return]

    def batch(step: int, gen: torch.Generator, _make: Any = setup.batch) -> Any:
        return tree_map(lambda t: t.double() if t.is_floating_point() else t, _make(step, gen))

    return replace(setup, name=f"{setup.name}[fp64]", model=model, batch=batch)


@dataclass(frozen=True)
class PrecisionLane:
    setup: str
    seed: int
    steps: tuple[int, ...]
    #: per checkpoint: |L_fp32 - L_fp64| and |L_low - L_fp64|
    fp32_distance: tuple[float, ...]
    low_distance: tuple[float, ...]
    low: str

    @property
    def d32(self) -> float:
        return max(self.fp32_distance)

    @property
    def dlow(self) -> float:
        return max(self.low_distance)

    @property
    def ratio(self) -> float:
        """D32 / Dbf16: at most PRECISION_FRACTION on a healthy stack."""
        if self.dlow > 0:
            return self.d32 / self.dlow
        return 0.0 if self.d32 == 0 else math.inf


def _distances(run: Run, reference: Run) -> tuple[float, ...]:
    return tuple(
        abs(run.eval_losses[t] - v) if math.isfinite(run.eval_losses[t]) else math.inf
        for t, v in sorted(reference.eval_losses.items())
    )


def precision_lane(
    setup: Setup,
    seed: int = 0,
    device: torch.device | str = "cpu",
    fp32_run: Run | None = None,
    low_run: Run | None = None,
    fp32_recipe: Recipe = FP32,
    low: Recipe = BF16,
    reference: Run | None = None,
) -> PrecisionLane:
    """Distances of the fp32 run and of the bf16 autocast run from an fp64 run (same data order;
    ``reference``: that fp64 run, where the caller has it)."""
    if reference is None:
        reference = train(fp64_setup(setup), FP32, seed, device)
    run32 = fp32_run if fp32_run is not None else train(setup, fp32_recipe, seed, device)
    runlow = low_run if low_run is not None else train(setup, low, seed, device)
    return PrecisionLane(
        setup.name,
        seed,
        tuple(sorted(reference.eval_losses)),
        _distances(run32, reference),
        _distances(runlow, reference),
        low.name,
    )


def judge_precision(lane: PrecisionLane) -> ClaimComparison:
    """fp32 at most PRECISION_FRACTION as far from the fp64 run as bf16 autocast is."""
    worst = max(range(len(lane.steps)), key=lambda i: lane.fp32_distance[i])
    return compare_claim(
        f"{lane.setup}.fp32_over_{lane.low}_distance_from_fp64",
        lane.ratio,
        lane.ratio <= PRECISION_FRACTION,
        f"max_t |L_fp32 - L_fp64| <= sqrt(u_fp32/u_bf16) = 2^-8 x max_t |L_{lane.low} - L_fp64| (seed {lane.seed})",
        detail=(
            f"{lane.setup}: fp32 is {lane.d32:.3g} from the fp64 run (worst at step {lane.steps[worst]}), "
            f"{lane.ratio:.3g} of {lane.low} autocast's {lane.dlow:.3g}: fp32 lost precision on this stack (a "
            "regression shared by fp32 and AMP, invisible to parity)",
        ),
        allowance=PRECISION_FRACTION,
        unit="x",
    )
