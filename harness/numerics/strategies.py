"""hypothesis strategies for fp32 inputs that stress a target format's rounding (pure, reusable)."""

from __future__ import annotations

import math

from hypothesis import strategies as st

from harness.numerics.formats import FP32, FloatFormat, is_fp32_exact

MAX_VALUES = 64


def fp32_neighbours(x: float) -> list[float]:
    """x and the fp32 values one ulp either side of it (same sign)."""
    bits = FP32.round_bits(x).bits
    assert bits is not None
    out = [x]
    if bits & ~FP32.sign_bit:
        out.append(FP32.decode(bits - 1))
    if (bits & ~FP32.sign_bit) < FP32.max_finite_bits:
        out.append(FP32.decode(bits + 1))
    return out


@st.composite
def ties(draw: st.DrawFn, fmt: FloatFormat) -> float:
    """Exact midpoints between adjacent finite values of ``fmt`` (every one is an fp32 value), or one
    fp32 ulp beside them."""
    b = draw(st.integers(0, fmt.max_finite_bits - 1))
    mid = (fmt.decode(b) + fmt.decode(b + 1)) / 2
    x = draw(st.sampled_from(fp32_neighbours(mid)))
    return -x if draw(st.booleans()) else x


@st.composite
def near_overflow(draw: st.DrawFn, fmt: FloatFormat) -> float:
    t = FP32.round(fmt.overflow_threshold) if fmt.overflow_threshold <= FP32.max else FP32.max
    bits = FP32.round_bits(t).bits
    assert bits is not None
    x = FP32.decode(min(FP32.max_finite_bits, max(0, bits + draw(st.integers(-8, 8)))))
    return -x if draw(st.booleans()) else x


def subnormal_range(fmt: FloatFormat) -> st.SearchStrategy[float]:
    """fp32 values around the target's subnormal range (where flush-to-zero bugs live)."""
    hi = min(fmt.smallest_normal * 2, FP32.max)
    return st.floats(-hi, hi, width=32, allow_subnormal=True)


def fp32_values(fmt: FloatFormat) -> st.SearchStrategy[float]:
    """Any fp32 value (inf and NaN included), biased toward the hard cases of ``fmt``."""
    return st.one_of(
        st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
        ties(fmt),
        near_overflow(fmt),
        subnormal_range(fmt),
        st.floats(-fmt.max, fmt.max, width=32).filter(math.isfinite),
    )


def fp32_lists(fmt: FloatFormat) -> st.SearchStrategy[list[float]]:
    return st.lists(fp32_values(fmt), min_size=1, max_size=MAX_VALUES)


def hard_cases(fmt: FloatFormat) -> list[float]:
    """Deterministic fp32 inputs every cast property must see (run as an explicit example):
    ties that round down and up to even near 1 and in the subnormals, half the smallest
    subnormal, the overflow threshold and its neighbour, the maximum, inf and NaN."""
    one, eps, sub = 1.0, fmt.eps, fmt.smallest_subnormal
    cases = [
        one + eps / 2,  # tie between 1 (even) and 1+eps: down
        one + 3 * eps / 2,  # tie between 1+eps (odd) and 1+2eps: up
        sub / 2,  # tie between 0 and the smallest subnormal: to zero
        3 * sub / 2,  # tie between sub (odd) and 2*sub: up
        fmt.smallest_normal - sub / 2,  # tie just below the normal range
        fmt.max,
    ]
    if fmt.overflow_threshold <= FP32.max:
        t_bits = FP32.round_bits(fmt.overflow_threshold).bits
        assert t_bits is not None
        cases += [FP32.decode(t_bits - 1), fmt.overflow_threshold]
    cases = [c for c in cases if is_fp32_exact(c)]
    return [*cases, *(-c for c in cases), math.inf, -math.inf, math.nan]
