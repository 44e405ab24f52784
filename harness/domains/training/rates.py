"""Measured error rates of the training decision rules: how often a clean run fails (false
alarms), and the smallest injected numerical fault each rule still catches (detection limit).

The injected fault is relative Gaussian noise on every gradient element of an fp32 run
(``Recipe.grad_noise``), at levels 2^-k: a fault of known size that grows smoothly from rounding
level to gross. Each measurement is paired: the faulty run and its reference share the data
order (seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from harness.domains.training.loop import Run, train
from harness.domains.training.parity import RecipeResult, judge, parity, seed_band
from harness.domains.training.precision import fp64_setup, judge_precision, precision_lane
from harness.domains.training.recipes import BF16, FP32, Recipe, Setup

#: Gradient-noise levels tried, smallest first (relative standard deviation per element).
NOISE_LADDER: tuple[float, ...] = tuple(2.0**-k for k in (20, 16, 12, 8, 4, 2, 0))


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
            cp = recipe.fp32_counterpart()
            ref = fp[s] if not run.skipped_at else train(setup, cp, s, device, frozenset(run.skipped_at))
            verdict = judge(setup.name, RecipeResult(recipe, run, ref, parity(run, ref, band)))
            runs += 1
            alarms += not verdict.passed
    found = []
    for level in ladder:
        caught = sum(not parity(train(setup, _noisy(level), s, device), fp[s], band).passed for s in range(fault_seeds))
        found.append(Detection(level, caught, fault_seeds))
    return Rates("parity", setup.name, runs, alarms, tuple(found))


def precision_rates(
    setup: Setup,
    clean_seeds: int = 8,
    fault_seeds: int = 4,
    ladder: Sequence[float] = NOISE_LADDER,
    device: torch.device | str = "cpu",
) -> Rates:
    """The fp64 precision lane: clean fp32 on ``clean_seeds`` seeds, and fp32 with gradient noise."""
    seeds = range(max(clean_seeds, fault_seeds))
    refs = {s: train(fp64_setup(setup), FP32, s, device) for s in seeds}
    lows = {s: train(setup, BF16, s, device) for s in seeds}

    def lane(s: int, recipe: Recipe) -> bool:
        return judge_precision(
            precision_lane(setup, s, device, fp32_recipe=recipe, low_run=lows[s], reference=refs[s])
        ).passed

    alarms = sum(not lane(s, FP32) for s in range(clean_seeds))
    found = [Detection(level, sum(not lane(s, _noisy(level)) for s in range(fault_seeds)), fault_seeds) for level in ladder]
    return Rates("precision", setup.name, clean_seeds, alarms, tuple(found))
