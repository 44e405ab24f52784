"""Whether a value left its band: the one trend rule the dashboard and ``amp-harness diff`` apply.

Pure arithmetic on floats (no pandas, no files): a deterministic value (drift 0) leaves its band
when it changed at all, a statistic when it moved by more than its stated drift as a ratio; without
a stated drift, the history's robust spread decides. A change between finite and inf/NaN leaves it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

#: Without an allowance in the rows, a move beyond this many robust standard deviations of the
#: history (1.4826 x MAD, the normal-consistent median absolute deviation) is a violation:
#: 3 sigma, the conventional control-chart limit.
SIGMAS = 3.0
MAD_TO_SIGMA = 1.4826


def violates(value: float, ref: float, drift: float | None, history: Sequence[float]) -> int:
    """+1/-1 when ``value`` left the band around ``ref`` (up/down), else 0."""
    if not (math.isfinite(value) and math.isfinite(ref)):
        same = (math.isnan(value) and math.isnan(ref)) or value == ref
        return 0 if same else (1 if math.isnan(value) or value > ref else -1)
    if drift is None or math.isnan(drift):
        # no stated drift (synthetic or hand-made rows): the history's robust spread decides
        allowed = SIGMAS * MAD_TO_SIGMA * statistics.median(abs(v - ref) for v in history)
        return 0 if abs(value - ref) <= allowed else (1 if value > ref else -1)
    if drift == 0.0 or ref == 0.0:
        return 0 if value == ref else (1 if value > ref else -1)
    ratio = value / ref
    return 0 if 1 / (1 + drift) <= ratio <= 1 + drift else (1 if ratio > 1 else -1)


def band(ref: float, drift: float | None) -> tuple[float, float] | None:
    """The values that do not violate around ``ref`` (None without a stated drift)."""
    if drift is None or math.isnan(drift) or not math.isfinite(ref):
        return None
    lo, hi = sorted((ref / (1 + drift), ref * (1 + drift)))
    return lo, hi


def finite_or_none(value: Any) -> float | None:
    """``value`` as a float; None where it is not a number or is NaN (inf stays)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out
