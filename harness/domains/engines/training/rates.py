"""Measured error rates of the training decision rules: how often a clean run fails (false
alarms), and the smallest injected numerical fault each rule still catches (detection limit).

The injected fault is relative Gaussian noise on every gradient element of an fp32 run
(``Recipe.grad_noise``), at levels 2^-k: a fault of known size that grows smoothly from rounding
level to gross. Each measurement is paired: the faulty run and its reference share the data
order (seed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.domains.engines.training import amp_lane as L
from harness.domains.engines.training import module_lane as ML
from harness.domains.engines.training.loop import Run, train
from harness.domains.engines.training.parity import (
    RecipeResult,
    judge,
    outlier_allowance,
    parity,
    per_step_spread,
    reference_for,
    seed_band,
)
from harness.domains.engines.training.precision import (
    PRECISION_SEEDS,
    PrecisionLane,
    fp64_setup,
    judge_precision,
    precision_lane,
)
from harness.domains.engines.training.recipes import BF16, FP32, Recipe, Setup, to_device
from harness.numerics.comparison import compare_curves

#: Gradient-noise levels tried, smallest first (relative standard deviation per element): from
#: rounding level (2^-20) to several times the gradient itself (2^3).
NOISE_LADDER: tuple[float, ...] = tuple(2.0**k for k in (-20, -16, -12, -8, -4, -2, 0, 1, 2, 3))


@dataclass(frozen=True)
class Detection:
    level: float
    caught: int
    runs: int


@dataclass(frozen=True)
class Rates:
    """One rule on one setup: clean runs and how many failed; the fault ladder and what it caught."""

    rule: str
    setup: str
    clean_runs: int
    false_alarms: int
    ladder: tuple[Detection, ...]

    @property
    def false_alarm_rate(self) -> float:
        return self.false_alarms / self.clean_runs if self.clean_runs else 0.0

    @property
    def detection_limit(self) -> float | None:
        """The smallest level caught in every run, above which every level is caught too."""
        limit = None
        for d in reversed(self.ladder):
            if d.caught < d.runs:
                break
            limit = d.level
        return limit


def _ladder(ladder: Sequence[float], caught: Callable[[float], tuple[int, int]]) -> tuple[Detection, ...]:
    """The detection ladder: at each noise level, (runs that failed the rule, runs)."""
    return tuple(Detection(level, *caught(level)) for level in ladder)


def _noisy(level: float) -> Recipe:
    return replace(FP32, name=f"fp32+grad_noise({level:.3g})", grad_noise=level)


def parity_rates(
    setup: Setup,
    recipes: Sequence[Recipe] = (BF16,),
    band_seeds: int = 8,
    clean_seeds: int = 8,
    fault_seeds: int = 4,
    ladder: Sequence[float] = NOISE_LADDER,
    device: torch.device | str = "cpu",
) -> Rates:
    """The parity rule: clean recipes on ``clean_seeds`` seeds each (paired with fp32 on the same
    seed, the band from ``band_seeds`` other fp32 seeds), and fp32 with gradient noise."""
    fp: dict[int, Run] = {s: train(setup, FP32, s, device) for s in range(band_seeds + clean_seeds)}
    band = seed_band([fp[s] for s in range(clean_seeds, clean_seeds + band_seeds)])
    alarms = runs = 0
    for recipe in recipes:
        for s in range(clean_seeds):
            run = train(setup, recipe, s, device)
            ref = reference_for(setup, recipe, run, fp[s], device)
            verdict = judge(setup.name, RecipeResult(recipe, run, ref, parity(run, ref, band)))
            runs += 1
            alarms += not verdict.passed
    found = _ladder(
        ladder,
        lambda level: (
            sum(not parity(train(setup, _noisy(level), s, device), fp[s], band).passed for s in range(fault_seeds)),
            fault_seeds,
        ),
    )
    return Rates("parity", setup.name, runs, alarms, found)


def precision_rates(
    setup: Setup,
    clean_seeds: int = 6,
    fault_seeds: int = 3,
    ladder: Sequence[float] = NOISE_LADDER,
    device: torch.device | str = "cpu",
) -> Rates:
    """The fp64 precision lane, judged as the suite judges it (median of PRECISION_SEEDS seeds):
    clean fp32 over ``clean_seeds`` seeds in disjoint groups, and fp32 with gradient noise."""
    n = PRECISION_SEEDS
    seeds = range(max(clean_seeds, fault_seeds))
    refs = {s: train(fp64_setup(setup), FP32, s, device) for s in seeds}
    lows = {s: train(setup, BF16, s, device) for s in seeds}

    def lane(s: int, recipe: Recipe) -> PrecisionLane:
        return precision_lane(setup, s, device, fp32_recipe=recipe, low_run=lows[s], reference=refs[s])

    groups = [range(g, g + n) for g in range(0, clean_seeds - n + 1, n)]
    alarms = sum(not judge_precision([lane(s, FP32) for s in group]).passed for group in groups)
    faulty = [range(g, g + n) for g in range(0, fault_seeds - n + 1, n)]
    found = _ladder(
        ladder,
        lambda level: (
            sum(not judge_precision([lane(s, _noisy(level)) for s in group]).passed for group in faulty),
            len(faulty),
        ),
    )
    return Rates("precision", setup.name, len(groups), alarms, found)


def curve_rates(
    setup: Setup,
    seeds: int = 8,
    fault_seeds: int = 4,
    ladder: Sequence[float] = NOISE_LADDER,
    device: torch.device | str = "cpu",
) -> Rates:
    """The golden curves' approximate lane, leave-one-out: each fp32 seed's curve judged against
    seed 0's (the stored curve) within the spread and outlier allowance of the other seeds; and
    fp32 with gradient noise (data order of seed 0) against the same."""
    fp = [train(setup, FP32, s, device) for s in range(seeds + 1)]
    allowed = outlier_allowance(setup.steps, seeds)

    def within(curve: Run, others: Sequence[Run]) -> bool:
        band = per_step_spread([fp[0], *others])
        result = compare_curves(
            "loo", {"c": fp[0].losses}, {"c": curve.losses}, {"c": band}, allowed.steps, "", allowed.longest_run
        )
        return result.passed

    alarms = sum(not within(fp[i], [r for j, r in enumerate(fp[1:], 1) if j != i]) for i in range(1, seeds + 1))

    def caught(level: float) -> tuple[int, int]:
        noisy = [train(setup, replace(_noisy(level), noise_seed=k + 1), 0, device) for k in range(fault_seeds)]
        return sum(not within(run, fp[1:seeds]) for run in noisy), fault_seeds

    found = _ladder(ladder, caught)
    return Rates("golden curves (approximate lane)", setup.name, seeds, alarms, found)


#: Gradient-noise levels of the AMP lane's ladder: finer than parity's, around the formats' own
#: unit roundoff (bf16 2^-8, fp16 2^-11).
LANE_LADDER: tuple[float, ...] = tuple(2.0**k for k in (-12, -11, -10, -9, -8, -7, -6, -5, -4, -3, -2, -1, 0))


@dataclass(frozen=True)
class LaneRates:
    """The AMP lane on one setup and recipe: clean runs, and per clean run the fault ladder and the
    canonical broken recipes, all judged from that run's states."""

    rates: Rates
    #: per clean run: the clean ratio
    clean_ratios: tuple[float, ...]
    #: canonical control name -> runs in which the lane caught it
    controls_caught: dict[str, int]
    #: per noise level, the smallest ratio over the runs (a level is caught in every run when it
    #: exceeds the lane's factor); per control, the smallest ratio
    ladder_min: dict[float, float]
    controls_min: dict[str, float]


def lane_rates(
    setup: Setup,
    recipe: Recipe = BF16,
    clean_seeds: int = 30,
    ladder: Sequence[float] = LANE_LADDER,
    device: torch.device | str = "cpu",
) -> LaneRates:
    """The AMP lane: the clean recipe on ``clean_seeds`` data orders (each a false alarm when it
    fails), and from each clean run's states the recipe with relative gradient noise of each
    ladder level (caught when it fails) and the canonical broken recipes."""

    dtype = L.lane_dtype(recipe)
    if dtype is None:
        raise ValueError(f"recipe {recipe.name!r} runs in fp32: the AMP lane judges low-precision recipes")
    alarms, ratios = 0, []
    caught = {level: 0 for level in ladder}
    lowest = {level: float("inf") for level in ladder}
    controls: dict[str, int] = {}
    controls_min: dict[str, float] = {}
    for s in range(clean_seeds):
        run = train(setup, recipe, s, device, keep_states_at=L.lane_steps(setup))
        references = {dtype: L.lane_reference(setup, run, dtype, recipe, device)}
        lane = L.amp_lane(setup, recipe, run, references[dtype], device)
        ratios.append(lane.ratio)
        alarms += not L.judge_lane(lane).passed
        for level, noisy in L.ladder_lanes(setup, recipe, run, references[dtype], ladder, device).items():
            caught[level] += not L.judge_lane(noisy).passed
            lowest[level] = min(lowest[level], noisy.ratio)
        for control in L.power(setup, recipe, run, references, device):
            name = control.recipe.name
            controls[name] = controls.get(name, 0) + control.caught
            controls_min[name] = min(controls_min.get(name, float("inf")), control.lane.ratio)
    found = tuple(Detection(level, caught[level], clean_seeds) for level in ladder)
    rates = Rates("amp lane", setup.name, clean_seeds, alarms, found)
    return LaneRates(rates, tuple(ratios), controls, lowest, controls_min)


@dataclass(frozen=True)
class ModuleLaneRates:
    """The module lane on clean runs of one model and dtype: how many regions over how many
    seeds (each seed a fresh initialisation and batch), how many failed, the largest ratio."""

    setup: str
    dtype: str
    seeds: int
    regions: int
    failed: int
    worst: float
    worst_region: str


def module_lane_rates(
    setup: Setup, dtype: torch.dtype, seeds: int, device: torch.device | str = "cpu"
) -> ModuleLaneRates:
    """Clean module-lane ratios of ``setup`` under ``dtype`` over ``seeds`` initialisations and
    evaluation batches (the false-failure rate of :mod:`harness.domains.engines.training.module_lane`)."""
    dev = torch.device(device)
    regions = failed = 0
    worst, where = 0.0, ""
    for seed in range(seeds):
        model = setup.build(dev, seed)
        inputs, targets = to_device(setup.batch(seed, torch.Generator().manual_seed(seed)), dev)

        def step(model: torch.nn.Module = model, inputs: Any = inputs, targets: Any = targets) -> None:
            with torch.autocast(dev.type, dtype=dtype):
                loss = setup.loss_on(model, inputs, targets)
            loss.float().backward()  # type: ignore[no-untyped-call]

        for e in ML.observe({setup.name: model}, step, dev.type, dtype):
            regions += 1
            failed += not e.passed
            if e.ratio > worst:
                worst, where = e.ratio, e.name
    return ModuleLaneRates(setup.name, str(dtype), seeds, regions, failed, worst, where)
