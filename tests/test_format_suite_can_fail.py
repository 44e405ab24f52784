"""Negative controls: the format suite, run on deliberately wrong implementations, must fail.

The real suite file is copied into a scratch directory whose conftest swaps ``cast_under_test``
for a broken cast (``faults/casts.py``); the test asserts which checks catch it.
"""

from __future__ import annotations

import json

import pytest
from helpers import INNER_ARGS, inject

ROUNDING = "formats/test_cast_rounding.py"

ARGS = INNER_ARGS

#: broken cast -> checks that must catch it (test name and parameter id fragments)
MUST_CATCH = {
    "truncating": [
        "test_fp32_cast_rounds_to_nearest_even_everywhere[[]cpu-fp16]",
        "test_overflow_threshold_is_exact[[]cpu-fp16]",
    ],
    "ties_away_from_zero": [
        "test_fp32_cast_rounds_to_nearest_even_everywhere[[]cpu-bf16]",
        "test_values_below_half_the_smallest_subnormal_flush_to_zero[[]cpu-fp16]",
    ],
    "flush_subnormals": [
        "test_fp32_cast_rounds_to_nearest_even_everywhere[[]cpu-fp16]",
        "test_values_below_half_the_smallest_subnormal_flush_to_zero[[]cpu-fp16]",
    ],
    "saturating": ["test_overflow_threshold_is_exact[[]cpu-fp16]", "test_overflow_threshold_is_exact[[]cpu-bf16]"],
    "via_fp16": [
        "test_fp32_cast_rounds_to_nearest_even_everywhere[[]cpu-bf16]",
        "test_relative_error_is_at_most_unit_roundoff_in_the_normal_range[[]cpu-bf16]",
    ],
    "sign_flip_on_overflow": ["test_cast_is_monotonic[[]cpu-fp16]", "test_overflow_threshold_is_exact[[]cpu-fp16]"],
    "nan_to_zero": ["test_nan_stays_nan_and_infinities_keep_their_sign[[]cpu-fp16]"],
}


def _run_with_cast(pytester: pytest.Pytester, suite_copy, cast: str) -> pytest.RunResult:
    suite_copy(ROUNDING, conftest=False)
    chosen = "faults.casts.correct" if cast == "correct" else f"faults.casts.BROKEN_CASTS[{cast!r}]"
    inject(pytester, "formats", fixtures={"cast_under_test": chosen})
    return pytester.runpytest(*ARGS)


def test_the_suite_passes_on_the_correct_cast(pytester, suite_copy):
    """Control of the controls: with torch's own cast every check passes."""
    result = _run_with_cast(pytester, suite_copy, "correct")
    result.assert_outcomes(failed=0, passed=result.parseoutcomes()["passed"])
    assert result.ret == 0


@pytest.mark.parametrize("cast", sorted(MUST_CATCH))
def test_a_broken_cast_fails_the_checks_that_guard_against_it(pytester, suite_copy, cast):
    result = _run_with_cast(pytester, suite_copy, cast)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([f"FAILED *{pattern}*" for pattern in MUST_CATCH[cast]], consecutive=False)


def test_a_rounding_failure_explains_itself(pytester, suite_copy):
    result = _run_with_cast(pytester, suite_copy, "truncating")
    result.stdout.fnmatch_lines(
        [
            "*fp32->float16 cast: FAILED: mismatched elements: * / * (*%); criterion: bitwise equal to the float16 reference*",
            "*input *: expected 0x*, got 0x* (float16 bits: expected value *, got *)*",
        ],
        consecutive=False,
    )
    # hypothesis names the failing example so it can be reproduced
    result.stdout.fnmatch_lines(["*Failing*example*"], consecutive=False)


def test_a_changed_fp8_overflow_behaviour_fails_against_the_release_baseline(pytester, suite_copy):
    """A release that turns fp8 saturation into NaN (or back) fails with a per-case diff."""
    suite_copy("formats/test_fp8_casts.py")
    pytester.runpytest(*ARGS).assert_outcomes(failed=1, passed=2)  # first run writes the baseline
    [path] = (pytester.path / "baselines" / "formats").glob("torch-*/fp8_casts_cpu.json")
    doc = json.loads(path.read_text())
    doc["data"]["float8_e4m3fn"].update(twice_max="nan", overflow_behaviour="nan")  # as an older release did
    path.write_text(json.dumps(doc))
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*Baseline mismatch: baselines/formats/torch-*/fp8_casts_cpu.json*",
            "*float8_e4m3fn.overflow_behaviour: expected 'nan', got 'saturate' (changed)*",
            "*float8_e4m3fn.twice_max: expected 'nan', got 'max' (changed)*",
        ]
    )


def test_limits_disagreeing_with_torch_finfo_fail(pytester, suite_copy):
    suite_copy("formats/test_format_limits.py")
    inject(pytester, "formats", patches={"torch.finfo": "faults.casts.finfo_with_wrong_fp16_max"})
    result = pytester.runpytest(*ARGS, "-k", "finfo")
    result.assert_outcomes(failed=1, passed=4)
    result.stdout.fnmatch_lines(["*float16.max: torch 65536.0 != reference 65504.0*"])


def test_source_claims_fail_when_torch_flushes_fp16_subnormals(pytester, suite_copy):
    suite_copy("formats/test_source_claims.py")
    inject(pytester, "formats", patches={"torch.Tensor.half": "faults.casts.half_flushing_subnormals"})
    result = pytester.runpytest(*ARGS)
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] == 2, result.stdout.str()
    assert outcomes["passed"] >= 5
    result.stdout.fnmatch_lines(
        [
            "*test_source_text_claim_holds[[]fp16_smallest_positive]*",
            "*test_source_text_claim_holds[[]fp16_underflow_to_zero]*",
        ],
        consecutive=False,
    )
    result.stdout.fnmatch_lines(["*fp16.cast(2^-24): FAILED: got 0, expected 5.96046448e-08*"], consecutive=False)
