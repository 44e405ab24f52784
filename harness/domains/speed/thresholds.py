"""Speed thresholds of a hardware class, placed from that class's own calibration runs.

A threshold is *relative to the class's calibrated speed*, whether AMP is faster or slower than
fp32 there: it sits between the slowest calibration run and the median slowed DETECT_SLOWDOWN
times, so a DETECT_SLOWDOWN-times slower AMP path fails on every calibrated class (one where AMP
runs at 4x as well as one where it runs at 0.5x) and clean runs pass. Whether AMP pays off at all
on the class is a separate finding (:func:`pays_off`), not a threshold.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from harness.domains.speed.bench import DETECT_SLOWDOWN
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


@dataclass(frozen=True)
class Threshold:
    """``expect``: "judge" (``min_speedup`` applies) or "record" (calibration too noisy to judge)."""

    expect: str
    min_speedup: float | None
    origin: str
    #: median speedup of the calibration runs (the class's own speed)
    calibrated_median: float | None = None

    @property
    def judged(self) -> bool:
        return self.expect == "judge" and self.min_speedup is not None


def threshold_from_calibration(speedups: list[float]) -> Threshold:
    """Place a threshold from repeated measurements of one (workload, dtype) on one class.

    The threshold is the geometric mean of the slowest calibration run and the median slowed by
    DETECT_SLOWDOWN: equally far (as a ratio) from a clean run and from the path the gate must
    catch, whether the median is above or below 1. If the slowest clean run is already as slow as
    that path, the class is too noisy to judge this pair and it is recorded only.
    """
    med, low = statistics.median(speedups), min(speedups)
    runs = ", ".join(f"{s:.3g}" for s in speedups)
    caught = med / DETECT_SLOWDOWN
    if low <= caught:
        return Threshold(
            "record",
            None,
            f"calibrated: runs {runs} vary too much to tell a {DETECT_SLOWDOWN}x slower path; recorded, not judged",
            med,
        )
    t = math.sqrt(low * caught)
    return Threshold(
        "judge",
        round(t, 4),
        f"calibrated on this class: speedups {runs} (median {med:.3g}); "
        f"threshold sqrt(slowest {low:.3g} x median/{DETECT_SLOWDOWN} {caught:.3g}) = {t:.3g}",
        med,
    )


def pays_off_claim(workload: str, dtype: str, speedup: float, hardware_class: str) -> ClaimComparison:
    """The qualification policy's claim (``--amp-require-speedup``): AMP is faster than fp32."""
    return compare_claim(
        f"{workload}.amp_pays_off",
        speedup,
        speedup >= 1.0,
        "qualification policy --amp-require-speedup: AMP faster than fp32 (speedup >= 1)",
        detail=pays_off(workload, dtype, speedup, hardware_class),
        allowance=1.0,
        unit="x",
    )


def pays_off(workload: str, dtype: str, speedup: float, hardware_class: str) -> str:
    """The finding, in words: does AMP pay off for this workload on this class?"""
    if speedup >= 1.0:
        return f"{dtype} autocast {workload} is {speedup:.2g}x faster than fp32 on {hardware_class}"
    return f"{dtype} autocast {workload} is {1 / speedup:.2g}x slower than fp32 on {hardware_class}"
