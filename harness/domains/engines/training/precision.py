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
regression that costs fp32 about half of the 16 bits it has over bf16 fails.

The verdict is the median ratio over PRECISION_SEEDS data orders: the lane is a property of the
stack, while a single data order can meet a discrete event (a ReLU or BatchNorm statistic flipping)
after which fp32 and fp64 part ways exponentially (measured: 2 of 16 seeds of the CNN). A median of
3 needs two such seeds to fail. Measured error rates are in :mod:`harness.domains.engines.training.rates`
and docs/decision-rules.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.domains.engines.training.loop import Run, train
from harness.domains.engines.training.recipes import BF16, FP32, Recipe, Setup, cast_floating
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import BF16 as BF16_FORMAT
from harness.numerics.formats import FP32 as FP32_FORMAT

PRECISION_FRACTION = math.sqrt(FP32_FORMAT.unit_roundoff / BF16_FORMAT.unit_roundoff)
#: Data orders (seeds 0..n-1) whose median ratio is judged.
PRECISION_SEEDS = 3


def fp64_setup(setup: Setup) -> Setup:
    """The same problem in float64: model, floating inputs and targets (token ids untouched)."""

    def model(seed: int, _make: Any = setup.model) -> torch.nn.Module:
        return _make(seed).double()  # type: ignore[no-any-return]

    def batch(step: int, gen: torch.Generator, _make: Any = setup.batch) -> Any:
        return cast_floating(_make(step, gen), torch.float64)

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


def judge_precision(lanes: Sequence[PrecisionLane]) -> ClaimComparison:
    """The median over seeds of D32 / Dbf16 at most PRECISION_FRACTION."""
    if not lanes:
        raise ValueError("judge_precision needs the lanes of at least one seed")
    ratios = sorted(lane.ratio for lane in lanes)
    median = statistics.median(ratios)
    first = lanes[0]
    per_seed = ", ".join(f"seed {lane.seed}: {lane.ratio:.3g} ({lane.d32:.3g} vs {lane.dlow:.3g})" for lane in lanes)
    return compare_claim(
        f"{first.setup}.fp32_over_{first.low}_distance_from_fp64",
        median,
        median <= PRECISION_FRACTION,
        f"median over {len(lanes)} seeds of max_t |L_fp32 - L_fp64| / max_t |L_{first.low} - L_fp64| <= "
        "sqrt(u_fp32/u_bf16) = 2^-8",
        detail=(
            f"{first.setup}: fp32's distance from the fp64 run is a median {median:.3g} of {first.low} autocast's "
            f"(allowed {PRECISION_FRACTION:.3g}): fp32 lost precision on this stack (a regression shared by fp32 and "
            f"AMP, invisible to parity); per seed: {per_seed}",
        ),
        allowance=PRECISION_FRACTION,
        unit="x",
    )
