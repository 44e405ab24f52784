"""Speed thresholds of a hardware class, placed from that class's own calibration runs.

A threshold is *relative to the class's calibrated speed*, whether AMP is faster or slower than
fp32 there: it sits between the slowest calibration run and the median slowed DETECT_SLOWDOWN
times, so a DETECT_SLOWDOWN-times slower AMP path fails on every calibrated class (one where AMP
runs at 4x as well as one where it runs at 0.5x) and clean runs pass. Whether AMP pays off at all
on the class is a separate finding (:func:`pays_off`), not a threshold.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

import torch

from harness.domains.engines.bench.bench import CONTENDED, DETECT_SLOWDOWN, MIN_ROUNDS, PROBE_N
from harness.domains.engines.ops.catalogue import CATALOGUE
from harness.domains.engines.ops.probe import Category, probe
from harness.domains.speed.workloads import WORKLOADS
from harness.numerics.comparison import ClaimComparison, compare_claim

#: (workload, dtype) pairs of the default tier; the thorough tier adds the rest of WORKLOADS.
DEFAULT_CASES: tuple[tuple[str, str], ...] = (
    ("matmul_512", "bfloat16"),
    ("matmul_1024", "bfloat16"),
    ("matmul_256", "float16"),
    ("linear_fwd_bwd", "bfloat16"),
    ("sdpa", "bfloat16"),
    ("layer_norm", "bfloat16"),
    ("lm_train_step", "bfloat16"),
)
#: Cases the default tier measures on a GPU only: a small transformer's training step at a width
#: that keeps the GPU busy, the explainer's 2-3x training speedup from tensor cores (on the CPU
#: kinds its smallest rung takes seconds where bf16 is emulated: thorough there).
GPU_CASES: tuple[tuple[str, str], ...] = (("transformer_step", "bfloat16"),)


#: The farthest (as a ratio, either way) any calibration run of a pair may lie from the runs'
#: median for the pair to be judged: half the DETECT_SLOWDOWN gap on a log scale. Exactly then the
#: threshold (median / sqrt(DETECT_SLOWDOWN)) separates the calibration sample itself: every run
#: lies at or above it and every run slowed DETECT_SLOWDOWN times at or below it. Beyond it the
#: class's own clean runs and the slowdown the gate must catch overlap, and no threshold separates
#: them; the pair is recorded, not judged.
MAX_CALIBRATION_SCATTER = DETECT_SLOWDOWN**0.5


#: ``Threshold.expect`` of a workload that is no speed claim on the device (:func:`for_device`)
NO_CLAIM = "none"


@dataclass(frozen=True)
class Threshold:
    """``expect``: "judge" (``min_speedup`` applies), "record" (calibration too noisy to judge) or
    "none" (no speed claim on the device: autocast leaves the workload as it is, :func:`for_device`)."""

    expect: str
    min_speedup: float | None
    origin: str
    #: median speedup of the calibration runs (the class's own speed)
    calibrated_median: float | None = None
    #: the case's uncontended contention-probe seconds per iteration at calibration (CPU; rounds of
    #: the suite whose probe runs over bench.CONTENDED times it are not judged)
    probe_s: float | None = None
    #: the side of the probe ``probe_s`` was timed with (None: bench.PROBE_N, files before it varied)
    probe_side: int | None = None
    #: the baseline path's seconds per iteration at calibration (CPU, the judging clock: the median of
    #: the runs the threshold comes from); a pass whose baseline ran over bench.BASELINE_SLOWED times
    #: it is no verdict (None: files before it, and CUDA, where the clock is the GPU's)
    baseline_s: float | None = None
    #: the rung of the workload's size ladder the class was calibrated at (None: its first rung, or a
    #: workload with one size): the suite measures there, whatever it would choose, so that the
    #: threshold and the measurement are one computation
    size: int | None = None

    @property
    def judged(self) -> bool:
        return self.expect == "judge" and self.min_speedup is not None


#: A judged speedup as a trend (the dashboard): a change by more than this factor (either way) from
#: the median of the previous runs of its class is flagged. Half the DETECT_SLOWDOWN gap on a log
#: scale, the most a judged pair's calibration runs scatter: a 1.3x slower AMP path moves the
#: speedup twice as far. Stored in rows as a relative drift.
TREND_DRIFT = DETECT_SLOWDOWN**0.5 - 1.0


def threshold_from_calibration(speedups: list[float], what: str = "speedups") -> Threshold:
    """Place a threshold from repeated measurements of one (workload, dtype) on one class.

    The threshold is the geometric midpoint between the calibration runs' median and that median
    slowed DETECT_SLOWDOWN times (median / sqrt(DETECT_SLOWDOWN)): as far, as a ratio, from a clean
    run as from the path the gate must catch, whether the median is above or below 1. A pair whose
    calibration run lies farther than MAX_CALIBRATION_SCATTER from the median is too noisy here to be
    judged and is recorded only. ``what``: the statistic's name in the origin (any higher-is-better
    statistic: an interconnect's bandwidth is placed the same way).
    """
    med, low, high = statistics.median(speedups), min(speedups), max(speedups)
    runs = ", ".join(f"{s:.3g}" for s in speedups)
    scatter = max(high / med, med / low)
    if scatter > MAX_CALIBRATION_SCATTER:
        return Threshold(
            "record",
            None,
            f"calibrated: {what} {runs} lie up to {scatter:.3g}x from their median {med:.3g}, more than "
            f"{MAX_CALIBRATION_SCATTER:.3g}x (half the {DETECT_SLOWDOWN}x gap the gate must see): no threshold "
            "separates these clean runs from the same runs slowed; too noisy here to judge, recorded",
            med,
        )
    t = med / math.sqrt(DETECT_SLOWDOWN)
    return Threshold(
        "judge",
        round(t, 4),
        f"calibrated on this class: {what} {runs} (median {med:.3g}, runs within {scatter:.3g}x of it); "
        f"threshold median / sqrt({DETECT_SLOWDOWN}) = {t:.3g}",
        med,
    )


def calibrated(speedups: list[float], wanted: int, probe_s: float | None, taken: int | None = None) -> Threshold:
    """The threshold from a calibration's quietest uncontended runs (``speedups``; ``wanted`` were
    asked for, chosen from ``taken``), carrying the case's uncontended probe time. Fewer runs than
    asked for: the host kept the matrix units contended through the retakes; recorded, not judged."""
    if len(speedups) < wanted:
        med = statistics.median(speedups) if speedups else None
        return Threshold(
            "record",
            None,
            f"calibrated: only {len(speedups)} of {wanted} runs had {MIN_ROUNDS} rounds with the contention probe within "
            f"{CONTENDED:.3g}x of its uncontended time (other tenants of the host held the matrix units); recorded, "
            "calibrate again when the host is quieter",
            med,
            probe_s,
        )
    th = threshold_from_calibration(speedups)
    if taken is not None and taken > len(speedups):
        chosen = f"; the {len(speedups)} quietest of {taken} runs by the contention probe"
        th = dataclasses.replace(th, origin=th.origin + chosen)
    return dataclasses.replace(th, probe_s=probe_s)


def probe_reference(
    this_calibration: float | None, stored: dict[str, Threshold], dtype: str, side: int | None = None
) -> float | None:
    """The uncontended probe time of ``dtype``: the fastest of this calibration's reference and the
    ones the class's file already holds for that dtype and probe ``side`` (one probe kernel per dtype;
    contention only adds time). A calibration of one or two cases during a contended spell has too
    few rounds to find the uncontended time itself; an earlier calibration of the class (same torch) has it."""
    earlier = [
        th.probe_s
        for key, th in stored.items()
        if key.endswith(f"/{dtype}") and th.probe_s is not None and (th.probe_side or PROBE_N) == (side or PROBE_N)
    ]
    known = [p for p in (this_calibration, *earlier) if p is not None]
    return min(known) if known else None


def unchanged_by_autocast(workload: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why AMP cannot be judged on this workload here, or None. Where autocast runs the workload's
    op in float32 (layer_norm on CPU, unlike CUDA), the fp32 and AMP paths are one computation and
    their ratio is noise: on these shared machines it wandered from 1.06 to 0.74 between calibration
    and a clean run, twice in a row. Decided by the autocast probe, not by a list of names."""
    known = WORKLOADS.get(workload)
    op = known.autocast_op if known is not None else None
    if op is None:
        return None

    [case] = [c for c in CATALOGUE if c.name == op]
    category = probe(case, device, dtype).category(dtype)
    if category is Category.LOWER_PRECISION:
        return None
    return (
        f"autocast runs {op} as {category.value} on {device.type} ({dtype}): the AMP and fp32 paths are the "
        "same computation, so their ratio is noise; recorded, not judged"
    )


def for_device(
    threshold: Threshold | None, workload: str, device: torch.device, dtype: torch.dtype
) -> Threshold | None:
    """The threshold as it applies on ``device``: no claim (``expect="none"``, skipped) where autocast
    does not change the workload there (:func:`unchanged_by_autocast`). Calibration and the suite
    both go through this."""
    if threshold is None:
        return None
    unchanged = unchanged_by_autocast(workload, device, dtype)
    if unchanged is None:
        return threshold
    return dataclasses.replace(threshold, expect=NO_CLAIM, min_speedup=None, origin=unchanged)


def pays_off_claim(
    workload: str, dtype: str, speedup: float, hardware_class: str, baseline: str = "fp32"
) -> ClaimComparison:
    """The qualification policy's claim (``--amp-require-speedup``): AMP is faster than its
    baseline (fp32, or eager AMP for a compiled workload)."""
    return compare_claim(
        f"{workload}.amp_pays_off",
        speedup,
        speedup >= 1.0,
        f"qualification policy --amp-require-speedup: AMP faster than {baseline} (speedup >= 1)",
        detail=pays_off(workload, dtype, speedup, hardware_class, baseline),
        allowance=1.0,
        unit="x",
    )


def pays_off(workload: str, dtype: str, speedup: float, hardware_class: str, baseline: str = "fp32") -> str:
    """The finding, in words: does AMP pay off for this workload on this class?"""
    if speedup >= 1.0:
        return f"{dtype} autocast {workload} is {speedup:.2g}x faster than {baseline} on {hardware_class}"
    return f"{dtype} autocast {workload} is {1 / speedup:.2g}x slower than {baseline} on {hardware_class}"
