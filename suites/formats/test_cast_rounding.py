"""Claim family: casting fp32 to a low-precision format is IEEE round-to-nearest-even.

Every property compares torch's cast (``cast_under_test``) with the bit-level reference of
:mod:`harness.numerics.formats`, on hypothesis-drawn fp32 values biased toward ties, subnormals and the
overflow threshold. fp8 overflow is excluded from the reference here (the formats leave it to the
implementation); ``test_fp8_casts.py`` records and baselines it instead.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from harness.domains.formats.repro import cast_rounding
from harness.numerics.comparison import compare_bits, compare_bound, compare_predicate, explain
from harness.numerics.formats import (
    BF16,
    FP8_E4M3FN,
    FP8_E5M2,
    FP16,
    FP32,
    Encoding,
    FloatFormat,
    cast_bits,
    torch_dtype,
)
from harness.numerics.strategies import fp32_lists, hard_cases

pytestmark = pytest.mark.amp_capability("formats")

TARGETS = [FP16, BF16, FP8_E4M3FN, FP8_E5M2]
IEEE_TARGETS = [f for f in TARGETS if f.encoding is Encoding.IEEE]


def _ids(f: FloatFormat) -> str:
    return f.short


def _script(fmt: FloatFormat, values: list[float], cast_under_test, broke: str):
    """The failing values as a script: torch's own cast of them against round-to-nearest-even in
    exact rationals (every property here follows from it, so the script shows any break); a cast
    of your own keeps none."""
    if cast_under_test is not cast_bits:
        return None
    return cast_rounding(
        f"torch's float32 -> {fmt.name} cast of the values that {broke}: values not rounded to nearest even",
        torch.tensor(values, dtype=torch.float32),
        torch_dtype(fmt),
    )


def _defined(fmt: FloatFormat, x: float) -> bool:
    """Whether the reference defines the cast of x (not an overflow of a format without inf)."""
    return fmt.round_bits(x).bits is not None


@pytest.mark.amp_quick
@pytest.mark.parametrize("fmt", TARGETS, ids=_ids)
def test_fp32_cast_rounds_to_nearest_even_everywhere(fmt, amp_device, cast_under_test, amp_record):
    with amp_record.property_run(
        f"fp32->{fmt.short}.rne_mismatches", "bitwise equal to reference RNE", dtype=fmt.name, device=amp_device
    ) as tally:

        @given(values=fp32_lists(fmt))
        @example(values=hard_cases(fmt))
        def prop(values: list[float]) -> None:
            values = [v for v in values if _defined(fmt, v)]
            bits = cast_under_test(values, fmt, amp_device)
            result = compare_bits(f"fp32->{fmt.name} cast", bits, [fmt.round_bits(v).bits for v in values], fmt, values)
            tally.add(len(values))
            if not result.passed and cast_under_test is cast_bits:  # torch's own cast: a script can run it
                tally.repro = cast_rounding(
                    f"torch's float32 -> {fmt.name} cast of the failing values: values not rounded to nearest even",
                    torch.tensor(values, dtype=torch.float32),
                    torch_dtype(fmt),
                )
            assert result.passed, explain(result)

        prop()


@pytest.mark.parametrize("fmt", TARGETS, ids=_ids)
def test_relative_error_is_at_most_unit_roundoff_in_the_normal_range(fmt, amp_device, cast_under_test, amp_record):
    u = fmt.unit_roundoff
    with amp_record.property_run(
        f"fp32->{fmt.short}.max_relative_error",
        f"|fl(x)-x|/|x| <= u = 2^-{fmt.precision} for smallest_normal <= |x| <= max (Higham Thm 2.2)",
        dtype=fmt.name,
        device=amp_device,
    ) as tally:
        tally.bound, tally.unit = u, "relative"

        @given(values=st.lists(st.floats(fmt.smallest_normal, fmt.max, width=32), min_size=1, max_size=64))
        def prop(values: list[float]) -> None:
            values = values + [-v for v in values]
            got = [fmt.decode(b) for b in cast_under_test(values, fmt, amp_device)]
            rel = [abs(g - x) / abs(x) for g, x in zip(got, values, strict=False)]
            worst = max(rel)
            tally.add(len(values), worst)
            result = compare_bound(f"fp32->{fmt.name} worst relative error", worst, u, f"unit roundoff of {fmt.name}")
            if not result.passed:
                tally.repro = _script(fmt, values, cast_under_test, "exceeded the unit roundoff")
            assert result.passed, f"{explain(result)}; input {values[rel.index(worst)]!r} -> {got[rel.index(worst)]!r}"

        prop()


@pytest.mark.parametrize("fmt", TARGETS, ids=_ids)
def test_cast_is_monotonic(fmt, amp_device, cast_under_test, amp_record):
    with amp_record.property_run(
        f"fp32->{fmt.short}.monotonic", "x <= y implies fl(x) <= fl(y)", dtype=fmt.name, device=amp_device
    ) as tally:

        @given(values=fp32_lists(fmt))
        @example(values=hard_cases(fmt))
        def prop(values: list[float]) -> None:
            xs = sorted(v for v in values if not math.isnan(v) and _defined(fmt, v))
            got = [fmt.decode(b) for b in cast_under_test(xs, fmt, amp_device)]
            pairs = list(itertools.pairwise(xs))
            result = compare_predicate(
                f"fp32->{fmt.name} monotonic",
                pairs,
                list(itertools.pairwise(got)),
                lambda _x, g: g[0] <= g[1],
                "fl(x_i) <= fl(x_(i+1)) for sorted inputs",
            )
            tally.add(len(xs))
            if not result.passed:
                tally.repro = _script(fmt, xs, cast_under_test, "broke monotonicity")
            assert result.passed, explain(result)

        prop()


@pytest.mark.amp_quick
@pytest.mark.parametrize("fmt", IEEE_TARGETS, ids=_ids)
def test_overflow_threshold_is_exact(fmt, amp_device, cast_under_test, amp_record):
    """Below max + ulp(max)/2 a value rounds to a finite number; at and above it, to inf
    (fp16: 65519.99 -> 65504, 65520 -> inf)."""
    t = fmt.overflow_threshold
    cases: list[tuple[float, float]] = []
    if t <= FP32.max:
        below = FP32.decode(FP32.round_bits(t).bits - 1)  # type: ignore[operator]
        cases += [(below, fmt.max), (t, math.inf), (-below, -fmt.max), (-t, -math.inf)]
    else:
        cases += [(FP32.max, fmt.max)]
    if fmt is FP16:
        cases += [(FP32.round(65519.99), 65504.0), (65520.0, math.inf), (65536.0, math.inf)]
    inputs = [c[0] for c in cases]
    got = [fmt.decode(b) for b in cast_under_test(inputs, fmt, amp_device)]
    result = compare_predicate(
        f"fp32->{fmt.name} overflow threshold {t:.9g}",
        inputs,
        got,
        lambda g, e: g == e,
        f"|x| < {t:.9g} -> finite (max {fmt.max:.9g}); |x| >= {t:.9g} -> inf",
        expected=[c[1] for c in cases],
    )
    amp_record(
        "overflow_threshold",
        t,
        expected=fmt.overflow_threshold,
        dtype=fmt.name,
        device=amp_device,
        outcome=result.outcome,
        note="max + ulp(max)/2, derived from the bit layout",
    )
    amp_record.require(
        result,
        dtype=fmt.name,
        device=amp_device,
        repro=_script(fmt, inputs, cast_under_test, "cross the overflow threshold"),
    )


@pytest.mark.parametrize("fmt", TARGETS, ids=_ids)
def test_values_below_half_the_smallest_subnormal_flush_to_zero(fmt, amp_device, cast_under_test, amp_record):
    half = fmt.smallest_subnormal / 2
    with amp_record.property_run(
        f"fp32->{fmt.short}.underflow",
        f"|x| <= {half:.3g} (half the smallest subnormal, a tie to even zero) -> signed zero; "
        "just above -> the smallest subnormal",
        dtype=fmt.name,
        device=amp_device,
    ) as tally:

        @given(values=st.lists(st.floats(-half, half, width=32, allow_subnormal=True), min_size=1, max_size=64))
        def prop(values: list[float]) -> None:
            above = FP32.decode(FP32.round_bits(half).bits + 1)  # type: ignore[operator]
            xs = [*values, above, -above]
            got = [fmt.decode(b) for b in cast_under_test(xs, fmt, amp_device)]
            expected = [math.copysign(0.0, x) for x in values] + [fmt.smallest_subnormal, -fmt.smallest_subnormal]
            result = compare_predicate(
                f"fp32->{fmt.name} underflow",
                xs,
                list(zip(got, expected, strict=False)),
                lambda _x, ge: ge[0] == ge[1] and math.copysign(1, ge[0]) == math.copysign(1, ge[1]),
                "signed zero below half the smallest subnormal, smallest subnormal above",
            )
            tally.add(len(xs))
            if not result.passed:
                tally.repro = _script(fmt, xs, cast_under_test, "lie at the underflow threshold")
            assert result.passed, explain(result)

        prop()


@pytest.mark.parametrize("fmt", TARGETS, ids=_ids)
def test_nan_stays_nan_and_infinities_keep_their_sign(fmt, amp_device, cast_under_test, amp_record):
    inputs = [math.nan, -math.nan, math.inf, -math.inf]
    got = [fmt.decode(b) for b in cast_under_test(inputs, fmt, amp_device)]
    if fmt.encoding is Encoding.IEEE:
        expected = [math.nan, math.nan, math.inf, -math.inf]
    else:  # no inf: only NaN is specified here; what inf becomes is baselined in test_fp8_casts.py
        inputs, got, expected = inputs[:2], got[:2], [math.nan, math.nan]
    result = compare_predicate(
        f"fp32->{fmt.name} NaN/inf",
        inputs,
        list(zip(got, expected, strict=False)),
        lambda _x, ge: (math.isnan(ge[0]) and math.isnan(ge[1])) or ge[0] == ge[1],
        "NaN -> NaN; +-inf -> +-inf where the format has inf",
    )
    amp_record.require(
        result, dtype=fmt.name, device=amp_device, repro=_script(fmt, inputs, cast_under_test, "are NaN or infinite")
    )
