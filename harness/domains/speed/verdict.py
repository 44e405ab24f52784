"""The speed verdict of one (workload, dtype) measurement, decided once.

PASS or FAIL against the class's calibrated threshold; NOISY when the speedup's confidence interval
holds it, when too few rounds ran uncontended (the contention probe), when it falls below it
while other processes kept the machine busy, or when it lies above it with the baseline slower
than at calibration (each after one rerun); UNJUDGED when the class has no
calibration (the reason says which command calibrates it). The suite records the verdict's row and asserts from the same object.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from harness.domains.engines.bench.bench import (
    BASELINE_SLOWED,
    BUSY_OTHER_CORES,
    CONFIDENCE,
    CONTENDED,
    DETECT_SLOWDOWN,
    MIN_ROUNDS,
    QUIETER,
    Timing,
    is_busy,
    is_noisy,
)
from harness.domains.engines.bench.sizing import Floor
from harness.domains.speed.thresholds import NO_CLAIM, Threshold
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.verdict import Outcome, RowKind


class Abstention(enum.Enum):
    """Why a measurement gave no verdict (NOISY): typed, so that a report or a script counts the
    causes without reading the reason's words back."""

    #: the probe ran much faster than at calibration: the class was calibrated while contended
    CALIBRATED_CONTENDED = "calibrated_contended"
    #: too few rounds ran with the contention probe near its calibrated time
    CONTENDED = "contended"
    #: the speedup's confidence interval holds the threshold
    INTERVAL = "interval"
    #: below the threshold while other processes kept the machine busy
    BUSY = "busy"
    #: above the threshold with the baseline slower than at calibration: the speedup was raised
    BASELINE_SLOWED = "baseline_slowed"


@dataclass(frozen=True)
class SpeedVerdict:
    workload: str
    dtype: str
    hardware_class: str
    timing: Timing
    threshold: Threshold | None
    outcome: Outcome
    #: why it was not judged (UNJUDGED, NOISY), or what the threshold is (PASS/FAIL)
    reason: str
    #: NOISY only: which rule abstained
    abstained: Abstention | None = None
    #: the physics floor the case is held to (a GPU's matrix units: AMP no slower than fp32), if any
    floor: Floor | None = None

    @property
    def limit(self) -> float | None:
        """The speedup the case must reach: the class's threshold and the physics floor, the higher."""
        th = self.threshold.min_speedup if self.threshold is not None and self.threshold.judged else None
        limits = [x for x in (th, self.floor.minimum if self.floor is not None else None) if x is not None]
        return max(limits) if limits else None

    def claim(self) -> ClaimComparison:
        """The judged claim (PASS/FAIL only): speedup >= the class's threshold."""
        t, limit = self.timing, self.limit
        assert limit is not None and self.outcome in (Outcome.PASS, Outcome.FAIL)
        th = self.threshold.min_speedup if self.threshold is not None and self.threshold.judged else None
        what = (
            f"the {self.hardware_class} threshold"
            if self.floor is None or (th is not None and th >= self.floor.minimum)
            else "the physics floor"
        )
        return compare_claim(
            f"{self.workload}.speedup",
            t.speedup,
            self.outcome is Outcome.PASS,
            f"AMP-over-fp32 speedup >= {what} {limit}x ({self.reason})",
            detail=(
                f"{self.workload}/{self.dtype}: AMP speedup {t.speedup:.3g}x is below {what} "
                f"{limit}x ({t.describe()}; baseline {t.fp32_median_s * 1e3:.3g} ms, AMP {t.amp_median_s * 1e3:.3g} ms "
                f"per iteration); its origin: {self.reason}",
            ),
            allowance=limit,
            unit="x",
            kind=RowKind.SPEEDUP,
        )


def baseline_slowdown(timing: Timing, threshold: Threshold) -> float | None:
    """The judged rounds' baseline time over the class's calibrated one (None without a calibrated time)."""
    if threshold.baseline_s is None or threshold.baseline_s <= 0:
        return None
    return timing.fp32_median_s / threshold.baseline_s


def judge(
    workload: str,
    dtype: str,
    hardware_class: str,
    timing: Timing,
    threshold: Threshold | None,
    calibrate_command: str,
    floor: Floor | None = None,
) -> SpeedVerdict:
    """Decide one measurement. ``calibrate_command`` is what the UNJUDGED reason tells the user to
    run. ``floor``: the physics floor (:func:`harness.domains.engines.bench.sizing.physics_floor`): a speedup
    whose whole interval lies below it FAILS whatever the threshold, calibrated or not."""
    if floor is not None:
        lo, hi = timing.interval
        below = timing.speedup < floor.minimum and (hi < floor.minimum or timing.rounds < MIN_ROUNDS)
        if below:
            reason = (
                f"below the physics floor {floor.minimum:g}x (its {CONFIDENCE:.0%} interval [{lo:.3g}, {hi:.3g}]): "
                f"{floor.reason}"
            )
            return SpeedVerdict(workload, dtype, hardware_class, timing, threshold, Outcome.FAIL, reason, None, floor)
        uncalibrated = threshold is None or not threshold.judged
        if uncalibrated and timing.speedup >= floor.minimum and lo >= floor.minimum:
            reason = f"at or above the physics floor {floor.minimum:g}x ({floor.reason}); the class is not calibrated"
            return SpeedVerdict(workload, dtype, hardware_class, timing, threshold, Outcome.PASS, reason, None, floor)
    if threshold is None:
        reason = (
            f"NOT JUDGED: hardware class {hardware_class} has no calibrated speed thresholds "
            f"(thresholds of other classes never judge it); calibrate it: {calibrate_command}"
        )
        return SpeedVerdict(workload, dtype, hardware_class, timing, None, Outcome.UNJUDGED, reason)
    if threshold.expect == NO_CLAIM:
        # no calibration would judge it: skipped, not NOT JUDGED (which names the command to run)
        reason = f"not a speed claim here: {threshold.origin}"
        return SpeedVerdict(workload, dtype, hardware_class, timing, threshold, Outcome.SKIP, reason)
    if not threshold.judged:
        return SpeedVerdict(workload, dtype, hardware_class, timing, threshold, Outcome.UNJUDGED, threshold.origin)
    limit = threshold.min_speedup

    def noisy(cause: Abstention, reason: str) -> SpeedVerdict:
        return SpeedVerdict(workload, dtype, hardware_class, timing, threshold, Outcome.NOISY, reason, cause)

    if timing.judged_contention * QUIETER < 1.0:
        reason = (
            f"the contention probe ran {1 / timing.judged_contention:.3g}x faster than at calibration (more than "
            f"{QUIETER:.3g}x, the threshold's margin): the class was calibrated while other tenants of the host held its "
            f"matrix units, so its threshold is a contended machine's; no verdict; calibrate again: {calibrate_command}"
        )
        return noisy(Abstention.CALIBRATED_CONTENDED, reason)
    if timing.rounds < MIN_ROUNDS and timing.contended:
        reason = (
            f"only {timing.rounds} of {timing.taken} rounds ran with the contention probe within {CONTENDED:.3g}x of "
            f"its calibrated time (median {timing.contention:.3g}x): other tenants of the host held this core's matrix "
            f"units, invisible in this machine's load; fewer than {MIN_ROUNDS} rounds give no interval, so no verdict"
        )
        return noisy(Abstention.CONTENDED, reason)
    if is_noisy(timing, limit):
        lo, hi = timing.interval
        reason = (
            f"the speedup's {CONFIDENCE:.0%} interval [{lo:.3g}, {hi:.3g}] over {timing.rounds} rounds holds the "
            f"threshold {limit}, twice"
        )
        return noisy(Abstention.INTERVAL, reason)
    assert limit is not None
    if timing.speedup < limit and is_busy(timing):
        reason = (
            f"below the threshold {limit} while other processes kept {timing.other_load:.2g} CPU cores busy (more than "
            f"{BUSY_OTHER_CORES}): on a busy machine shared caches and memory slow the AMP and baseline paths unequally, "
            "so this is no verdict; measure on an idle machine"
        )
        return noisy(Abstention.BUSY, reason)
    slowed = baseline_slowdown(timing, threshold)
    if timing.speedup >= limit and slowed is not None and slowed > BASELINE_SLOWED:
        reason = (
            f"above the threshold {limit} with the baseline at {slowed:.3g}x its calibrated time (more than "
            f"{BASELINE_SLOWED:.3g}x, the threshold's margin): something outside the AMP path slowed the baseline, "
            f"which raises the speedup as far, so a {DETECT_SLOWDOWN}x slower AMP path could pass here; no verdict. "
            f"Measure when the host is quieter, or, if this stack's baseline is slower for good, calibrate again: "
            f"{calibrate_command}"
        )
        return noisy(Abstention.BASELINE_SLOWED, reason)
    if floor is not None and timing.speedup < floor.minimum:
        return SpeedVerdict(
            workload, dtype, hardware_class, timing, threshold, Outcome.NOISY, "below the physics floor within the "
            f"speedup's interval: {floor.reason}", Abstention.INTERVAL, floor
        )  # fmt: skip
    return SpeedVerdict(
        workload,
        dtype,
        hardware_class,
        timing,
        threshold,
        Outcome.of(timing.speedup >= limit),
        threshold.origin,
        None,
        floor,
    )
