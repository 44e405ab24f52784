"""Negative controls: the format suite, run on deliberately wrong implementations, must fail.

The real suite file is copied into a scratch directory whose conftest swaps ``cast_under_test``
for a broken cast (``fault_injection.py``); the test asserts which checks catch it.
"""

from __future__ import annotations

import pytest

from conftest import inject

ROUNDING = "formats/test_cast_rounding.py"
ARGS = (
    "-p",
    "no:cacheprovider",
    "--amp-no-report",
    "--hypothesis-profile=ci",
    "--amp-device=cpu",
    "-rf",
    # the outer run imported the real suite module under its basename already
    "--import-mode=importlib",
    # harness modules are imported by the outer run already, so the inner run cannot rewrite them
    "-W",
    "ignore::pytest.PytestAssertRewriteWarning",
)

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
    inject(
        pytester,
        "formats",
        f"import pytest\nfrom fault_injection import BROKEN_CASTS, correct\n\n"
        f"@pytest.fixture\ndef cast_under_test():\n    return {'correct' if cast == 'correct' else f'BROKEN_CASTS[{cast!r}]'}\n",
    )
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
