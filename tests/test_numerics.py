"""The pure layer: the bit-level format reference, tolerance derivations, comparison messages."""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from harness.numerics import tolerance as tol
from harness.numerics.comparison import (
    compare_bits,
    compare_data,
    compare_scalar,
    compare_tensors,
    compare_values,
    explain,
)
from harness.numerics.formats import BF16, FORMATS, FP8_E4M3FN, FP16, FP32, format_of, tensor_bits, torch_dtype


# -- formats ------------------------------------------------------------------------------------
def test_limits_of_fp16_from_the_layout():
    # IEEE 754-2008 binary16: published values
    assert (FP16.max, FP16.smallest_normal, FP16.smallest_subnormal, FP16.eps) == (
        65504.0,
        2.0**-14,
        2.0**-24,
        2.0**-10,
    )
    assert FP16.overflow_threshold == 65520.0


def test_e4m3fn_has_no_inf_and_a_single_nan_pattern():
    assert FP8_E4M3FN.max == 448.0
    assert FP8_E4M3FN.inf_bits is None
    assert math.isnan(FP8_E4M3FN.decode(0x7F))
    assert FP8_E4M3FN.decode(0x7E) == 448.0
    assert FP8_E4M3FN.decode(0x78) == 256.0
    assert FP8_E4M3FN.round_bits(1e6).bits is None
    assert FP8_E4M3FN.round_bits(1e6).overflow


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.short)
def test_unit_roundoff_is_two_to_the_minus_precision(fmt):
    assert fmt.unit_roundoff == 2.0**-fmt.precision == tol.unit_roundoff(torch_dtype(fmt))


def test_unit_roundoffs_named_in_the_brief():
    assert [tol.unit_roundoff(n) for n in ("fp32", "bf16", "fp16", "float8_e4m3fn", "float8_e5m2")] == [
        2.0**-24,
        2.0**-8,
        2.0**-11,
        2.0**-4,
        2.0**-3,
    ]


def test_unknown_format_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown floating-point format .fp12.; known: .*bf16"):
        format_of("fp12")


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=lambda f: f.short)
def test_reference_rounding_agrees_with_torch_on_random_fp32_bit_patterns(fmt):
    """An independent cross-check of the reference itself, on uniformly random bit patterns."""
    rng = random.Random(20261129)
    xs = [struct.unpack("<f", struct.pack("<I", rng.getrandbits(32)))[0] for _ in range(20000)]
    got = tensor_bits(torch.tensor(xs, dtype=torch.float32).to(torch_dtype(fmt)))
    result = compare_bits("reference vs torch", got, [fmt.round_bits(x).bits for x in xs], fmt, xs)
    assert result.passed, explain(result)


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_rounding_to_fp32_is_the_identity_on_fp32_values(x):
    assert FP32.round(x) == x


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_reference_rounding_is_nearest(x):
    r = FP16.round(x)
    if math.isinf(r):
        assert abs(x) >= FP16.overflow_threshold
        return
    bits = FP16.round_bits(x).bits
    assert bits is not None
    for neighbour in (bits - 1, bits + 1):
        if 0 <= neighbour < (1 << 16) and (neighbour ^ bits) >> 15 == 0 and math.isfinite(FP16.decode(neighbour)):
            assert abs(FP16.decode(neighbour) - x) >= abs(r - x)


# -- tolerances ---------------------------------------------------------------------------------
def test_gamma_is_n_u_over_one_minus_n_u():
    u = 2.0**-11
    assert tol.gamma(100, u) == pytest.approx(100 * u / (1 - 100 * u), rel=1e-15)
    assert tol.gamma(0, u) == 0.0


def test_gamma_refuses_a_vacuous_bound():
    with pytest.raises(ValueError, match="vacuous for n=2048"):
        tol.gamma(2048, 2.0**-11)


def test_summation_and_dot_bounds_scale_with_length_and_magnitude():
    s = tol.summation("fp16", 101, abs_sum=3.0)
    assert s.atol == pytest.approx(tol.gamma(100, 2.0**-11) * 3.0)
    assert s.rtol == 0
    assert "gamma_100" in s.origin
    assert "Higham" in s.origin
    d = tol.dot("bf16", 64, abs_dot=2.0)
    assert d.atol == pytest.approx(tol.gamma(64, 2.0**-8) * 2.0)


def test_rounding_tolerance_covers_subnormals_absolutely():
    t = tol.rounding("fp16")
    assert (t.rtol, t.atol) == (2.0**-11, 2.0**-25)
    assert t.allows(FP16.round(1e-7), 1e-7)
    assert not t.allows(0.0, 1e-7)


def test_a_tolerance_needs_an_origin_and_sane_numbers():
    with pytest.raises(ValueError, match="needs an origin"):
        tol.Tolerance(0.1, 0.0, " ")
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        tol.Tolerance(-1.0, 0.0, "x")
    with pytest.raises(ValueError, match="atol must be a finite number >= 0"):
        tol.Tolerance(0.0, math.nan, "x")


def test_tolerance_handles_nan_and_inf():
    t = tol.Tolerance(0.1, 0.0, "test")
    assert t.allows(math.nan, math.nan)
    assert not t.allows(math.nan, 1.0)
    assert t.allows(math.inf, math.inf)
    assert not t.allows(math.inf, 1e308)


# -- comparisons and messages -------------------------------------------------------------------
def test_elementwise_message_counts_and_shows_the_allowance():
    r = compare_values("x", [1.0, 2.5, 3.0], [1.0, 2.0, 3.5], tol.Tolerance(1e-5, 0.0, "test"))
    assert not r.passed
    assert r.count == 2
    msg = explain(r)
    assert "mismatched elements: 2 / 3 (66.7%)" in msg
    assert "greatest absolute difference: 0.5" in msg
    assert "rtol=1e-05" in msg
    assert "[1]: expected 2, got 2.5" in msg


def test_scalar_message_says_by_how_much_against_what_allowance():
    msg = explain(compare_scalar("loss", 1.2, 1.0, tol.Tolerance(0.0, 0.1, "seed spread")))
    assert msg == ("loss: FAILED: got 1.2, expected 1; |difference| 0.2 (up to 0.1 allowed: atol=0.1 (seed spread))")


def test_tensor_comparison_counts_every_mismatch():
    a = torch.tensor([1.0, 2.0, math.nan, 4.0])
    e = torch.tensor([1.0, 2.1, math.nan, 4.2])
    r = compare_tensors("t", a, e, tol.Tolerance(0.0, 0.15, "test"))
    assert r.count == 1
    assert r.total == 4
    assert r.max_abs_diff == pytest.approx(0.2, rel=1e-6)


def test_data_comparison_reports_paths_missing_and_new_keys():
    r = compare_data("b", {"a": {"x": 1.0, "y": "bf16"}, "gone": 1}, {"a": {"x": 1.5, "y": "fp16"}, "new": [1]})
    paths = {d.path: d.reason for d in r.differences}
    assert paths == {
        "a.x": "|diff|=0.5 > 0",
        "a.y": "changed",
        "gone": "missing from this run",
        "new[0]": "new in this run",
    }


def test_a_new_comparison_kind_is_one_class_explained_and_recorded_without_other_edits():
    """Each comparison kind owns its message and its row: a kind defined here, unknown to the
    harness, is explained by ``explain`` and recorded by the recorder as it says."""
    from dataclasses import dataclass

    from harness.numerics import comparison as cmp
    from harness.pytest_plugin.recording import Recorder, TestIdentity

    @dataclass(frozen=True)
    class RatioComparison(cmp._Judged):
        name: str
        ratio: float
        limit: float

        @property
        def passed(self) -> bool:
            return self.ratio <= self.limit

        def explain(self) -> str:
            return f"{self.name}: ratio {self.ratio} against limit {self.limit}"

        def measurement(self) -> cmp.Measurement:
            return cmp.Measurement(f"{self.name}.ratio", self.ratio, None, self.limit, "x", "a stated limit", {"k": 1})

    rows = []
    recorder = Recorder(TestIdentity("t", "s", "t"), "run", rows.append, lambda d: "p", lambda o, n: None)
    result = RatioComparison("speed", 2.5, 2.0)
    assert cmp.explain(result) == "speed: ratio 2.5 against limit 2.0"
    assert recorder.result(result, tags={"extra": True}) is False  # type: ignore[arg-type]
    [row] = rows
    assert (row.metric, row.value, row.allowance, row.unit, row.note) == (
        "speed.ratio",
        2.5,
        2.0,
        "x",
        "a stated limit",
    )
    assert row.outcome.value == "fail" and '"extra": true' in row.tags and '"k": 1' in row.tags
