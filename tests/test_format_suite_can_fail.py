"""Negative controls: the format suite, run on deliberately wrong implementations, must fail.

The real suite file is copied into a scratch directory whose conftest swaps ``cast_under_test``
for a broken cast (``faults/formats.py``); the test asserts which checks catch it.
"""

from __future__ import annotations

import json

import pytest
from helpers import InnerRun, assert_caught, assert_clean, inject, run_inner

ROUNDING = "formats/test_cast_rounding.py"

RNE = "test_fp32_cast_rounds_to_nearest_even_everywhere"
UNDERFLOW = "test_values_below_half_the_smallest_subnormal_flush_to_zero"
OVERFLOW = "test_overflow_threshold_is_exact"
NAN_INF = "test_nan_stays_nan_and_infinities_keep_their_sign"
MONOTONIC = "test_cast_is_monotonic"
REL_ERROR = "test_relative_error_is_at_most_unit_roundoff_in_the_normal_range"
EVERY = ("bf16", "fp16", "e4m3fn", "e5m2")
WITH_INF = ("bf16", "fp16", "e5m2")  # e4m3fn has no infinity: it has no overflow-to-inf threshold

#: broken cast -> {check: the formats on which it must fail}; exactly these fail, nothing else
MUST_CATCH: dict[str, dict[str, tuple[str, ...]]] = {
    "truncating": {RNE: EVERY, UNDERFLOW: EVERY, OVERFLOW: WITH_INF, REL_ERROR: EVERY},
    "ties_away_from_zero": {RNE: EVERY, UNDERFLOW: EVERY},
    "flush_subnormals": {RNE: EVERY, UNDERFLOW: EVERY},
    "saturating": {RNE: ("bf16", "fp16", "e5m2"), OVERFLOW: WITH_INF, NAN_INF: WITH_INF},
    "via_fp16": {
        RNE: ("bf16", "e4m3fn", "e5m2"),
        REL_ERROR: ("bf16",),
        OVERFLOW: ("bf16", "e5m2"),
        UNDERFLOW: ("bf16", "e4m3fn", "e5m2"),
    },
    "sign_flip_on_overflow": {MONOTONIC: EVERY, RNE: EVERY, OVERFLOW: WITH_INF},
    "nan_to_zero": {NAN_INF: EVERY, RNE: EVERY},
}


#: checks of the rounding file that a clean run must show passing: 6 checks x 4 formats, less the
#: overflow threshold of e4m3fn (no infinity)
ROUNDING_CHECKS = 6 * len(EVERY) - 1


def _run_with_cast(pytester: pytest.Pytester, suite_copy, cast: str) -> InnerRun:
    suite_copy(ROUNDING, conftest=False)
    chosen = "faults.formats.correct" if cast == "correct" else f"faults.formats.BROKEN_CASTS[{cast!r}]"
    inject(pytester, "formats", fixtures={"cast_under_test": chosen})
    return run_inner(pytester)


@pytest.mark.amp_thorough  # the suite itself runs on torch's cast in every `pytest suites/`
def test_the_suite_passes_on_the_correct_cast(pytester, suite_copy):
    """Control of the controls: with torch's own cast every check passes."""
    assert_clean(_run_with_cast(pytester, suite_copy, "correct"), at_least=ROUNDING_CHECKS)


#: The default tier's broken casts: together they make every check of the rounding file fail (each
#: run also shows that no other check fails); the others are in the thorough tier, ~2.5 s each.
DEFAULT_CASTS = ("truncating", "saturating", "sign_flip_on_overflow")


def test_the_default_casts_make_every_rounding_check_fail():
    caught = {check for cast in DEFAULT_CASTS for check in MUST_CATCH[cast]}
    assert caught == {RNE, UNDERFLOW, OVERFLOW, NAN_INF, MONOTONIC, REL_ERROR}


@pytest.mark.parametrize(
    "cast", [c if c in DEFAULT_CASTS else pytest.param(c, marks=pytest.mark.amp_thorough) for c in sorted(MUST_CATCH)]
)
def test_a_broken_cast_fails_exactly_the_checks_that_guard_against_it(pytester, suite_copy, cast):
    run = _run_with_cast(pytester, suite_copy, cast)
    assert_caught(run, *(f"*::{check}[[]cpu-{fmt}]" for check, fmts in MUST_CATCH[cast].items() for fmt in fmts))


def test_a_rounding_failure_explains_itself(pytester, suite_copy):
    result = _run_with_cast(pytester, suite_copy, "truncating").result
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
    first = run_inner(pytester)  # writes the baseline
    assert_caught(first, "*::test_fp8_overflow_inf_and_nan_behaviour_matches_this_releases_baseline*")
    assert_clean(run_inner(pytester), at_least=3)
    [path] = (pytester.path / "baselines" / "formats").glob("torch-*/fp8_casts_cpu.json")
    doc = json.loads(path.read_text())
    doc["data"]["float8_e4m3fn"].update(twice_max="nan", overflow_behaviour="nan")  # as an older release did
    path.write_text(json.dumps(doc))
    run = run_inner(pytester)
    assert_caught(run, "*::test_fp8_overflow_inf_and_nan_behaviour_matches_this_releases_baseline*")
    run.stdout.fnmatch_lines(
        [
            "*Baseline mismatch: baselines/formats/torch-*/fp8_casts_cpu.json*",
            "*float8_e4m3fn.overflow_behaviour: expected 'nan', got 'saturate' (changed)*",
            "*float8_e4m3fn.twice_max: expected 'nan', got 'max' (changed)*",
        ]
    )


def test_limits_disagreeing_with_torch_finfo_fail(pytester, suite_copy):
    suite_copy("formats/test_format_limits.py")
    inject(pytester, "formats", patches={"torch.finfo": "faults.formats.finfo_with_wrong_fp16_max"})
    run = run_inner(pytester, "-k", "finfo")
    assert_caught(run, "*::test_*finfo*")
    run.stdout.fnmatch_lines(["*float16.max: FAILED: got 65536*, expected 65504*"])


def test_source_claims_fail_when_torch_flushes_fp16_subnormals(pytester, suite_copy):
    suite_copy("formats/test_source_claims.py")
    inject(pytester, "formats", patches={"torch.Tensor.half": "faults.formats.half_flushing_subnormals"})
    run = run_inner(pytester)
    assert_caught(
        run,
        "*::test_source_text_claim_holds[[]fp16_smallest_positive]",
        "*::test_source_text_claim_holds[[]fp16_underflow_to_zero]",
    )
    run.stdout.fnmatch_lines(["*fp16.cast(2^-24): FAILED: got 0, expected 5.96046448e-08*"], consecutive=False)


def test_a_cast_that_rounds_toward_zero_fails_the_exhaustive_fp8_rounding_check(pytester, suite_copy):
    suite_copy("formats/test_fp8_casts.py", conftest=False)
    inject(pytester, "formats", fixtures={"cast_under_test": "faults.formats.truncating"})
    run = run_inner(pytester, "-k", "rounds")
    assert_caught(run, "*::test_fp32_to_fp8_rounds_every_value_and_midpoint_to_nearest_even[[]cpu-*]")
    run.stdout.fnmatch_lines(["*fp32->float8_e*m*exhaustive: FAILED: mismatched elements*"], consecutive=False)
