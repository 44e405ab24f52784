"""Tolerances that carry their derivation.

A :class:`Tolerance` is an allowance ``|actual - expected| <= atol + rtol * |expected|`` plus the
text that says where the numbers come from. Constructors derive them from a format's unit
roundoff ``u = 2^-p`` and the standard rounding-error bounds (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., 2002): one rounding is within ``u`` relatively (Thm 2.2), and
a recursive sum or dot product of length ``n`` is within ``gamma_n = n u / (1 - n u)`` of the
sum of absolute terms (Sec. 3.1 and eq. 4.4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from harness.numerics.formats import FloatFormat, format_of


@dataclass(frozen=True)
class Tolerance:
    """An allowance and its origin. No tolerance without its origin."""

    rtol: float
    atol: float
    origin: str

    def __post_init__(self) -> None:
        for name in ("rtol", "atol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"Tolerance.{name} must be a finite number >= 0, got {value!r}")
        if not self.origin.strip():
            raise ValueError("a Tolerance needs an origin: say where its numbers come from")

    def allowed(self, expected: float) -> float:
        """The absolute allowance at ``expected``."""
        return self.atol + self.rtol * abs(expected)

    def allows(self, actual: float, expected: float) -> bool:
        if math.isnan(actual) or math.isnan(expected):
            return math.isnan(actual) and math.isnan(expected)
        if math.isinf(actual) or math.isinf(expected):
            return actual == expected
        return abs(actual - expected) <= self.allowed(expected)

    def __add__(self, other: Tolerance) -> Tolerance:
        """Error sources that add up (first-order)."""
        return Tolerance(self.rtol + other.rtol, self.atol + other.atol, f"{self.origin} + {other.origin}")

    def scaled(self, factor: float, why: str) -> Tolerance:
        return Tolerance(self.rtol * factor, self.atol * factor, f"{factor:g} x ({self.origin}): {why}")

    def describe(self) -> str:
        parts = []
        if self.rtol:
            parts.append(f"rtol={self.rtol:.3g}")
        if self.atol:
            parts.append(f"atol={self.atol:.3g}")
        return f"{', '.join(parts)} ({self.origin})" if parts else self.origin

    def as_dict(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "atol": self.atol, "origin": self.origin}


EXACT = Tolerance(0.0, 0.0, "exact: the same computation must give bitwise-identical results")


def unit_roundoff(fmt: Any) -> float:
    """u = 2^-p for a format, dtype or name (fp32 2^-24, bf16 2^-8, fp16 2^-11, e4m3 2^-4, e5m2 2^-3)."""
    return format_of(fmt).unit_roundoff


def gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u), the bound for n successive roundings (Higham Lemma 3.1)."""
    if n < 0:
        raise ValueError(f"gamma_n needs n >= 0, got {n}")
    if n * u >= 1:
        raise ValueError(
            f"gamma_n is vacuous for n={n}, u={u:.3g} (n*u >= 1): the format cannot bound a "
            "reduction this long; use blocked/pairwise summation or a wider accumulator"
        )
    return n * u / (1 - n * u)


def rounding(fmt: Any) -> Tolerance:
    """One round-to-nearest into ``fmt``: relative u in the normal range, half the smallest
    subnormal absolutely below it."""
    f: FloatFormat = format_of(fmt)
    return Tolerance(
        rtol=f.unit_roundoff,
        atol=f.smallest_subnormal / 2,
        origin=(
            f"one rounding to {f.name}: u=2^-{f.precision} relative (Higham Thm 2.2), "
            f"half the smallest subnormal ({f.smallest_subnormal:.3g}/2) absolute"
        ),
    )


def summation(fmt: Any, n: int, abs_sum: float) -> Tolerance:
    """Recursive summation of n terms in ``fmt``: |error| <= gamma_{n-1} * sum|x_i|."""
    f = format_of(fmt)
    g = gamma(max(n - 1, 0), f.unit_roundoff)
    return Tolerance(
        rtol=0.0,
        atol=g * abs_sum,
        origin=f"sum of n={n} terms in {f.name}: gamma_{n - 1}={g:.3g} x sum|x_i|={abs_sum:.3g} (Higham eq. 4.4)",
    )


def dot(fmt: Any, k: int, abs_dot: float) -> Tolerance:
    """Dot product of length k accumulated in ``fmt``: |error| <= gamma_k * sum|a_i b_i|."""
    f = format_of(fmt)
    g = gamma(k, f.unit_roundoff)
    return Tolerance(
        rtol=0.0,
        atol=g * abs_dot,
        origin=f"dot product of length k={k} in {f.name}: gamma_{k}={g:.3g} x sum|a_i b_i|={abs_dot:.3g} (Higham eq. 3.5)",
    )


#: For figures quoted to one decimal in prose (e.g. "about 3.3 significant digits").
QUOTED_TO_ONE_DECIMAL = Tolerance(0.0, 0.05, "a figure quoted to one decimal (e.g. '3.3') is exact to +-0.05")
