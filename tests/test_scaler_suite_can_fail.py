"""Negative controls: plausible GradScaler bugs, injected, make the loss-scaler suite fail, each
caught by the check named here (the message shows which invariant or post-condition it broke)."""

from __future__ import annotations

import pytest
from helpers import INNER_ARGS, inject

ARGS = INNER_ARGS
FILES = ("scaler/test_gradscaler_state_machine.py", "scaler/test_overflow_in_training.py")

#: bug -> (test that must fail, text its failure must contain)
MUST_CATCH = {
    "NeverBacksOff": ("test_gradscaler_follows_the_reference_state_machine", "reference (torch semantics)"),
    "TrackerNotResetOnInf": ("test_gradscaler_follows_the_reference_state_machine", "reference (torch semantics)"),
    "GrowsOneStepLate": ("test_gradscaler_follows_the_reference_state_machine", "reference (torch semantics)"),
    "GrowthNotCapped": ("test_growth_is_capped_at_the_largest_float32", "scale inf, expected"),
    "NewScaleResetsTracker": ("test_gradscaler_follows_the_reference_state_machine", "set_scale"),
    "OnlyFirstOptimizerCounts": ("test_gradscaler_follows_the_reference_state_machine", "two_optimizers=True"),
    "MissesNaN": ("test_gradscaler_follows_the_reference_state_machine", "value=nan"),
    "StepsDespiteInf": ("test_gradscaler_follows_the_reference_state_machine", "a skipped step changed the parameters"),
    "SkipBumpsOptimizerStep": (
        "test_gradscaler_follows_the_reference_state_machine",
        "a skipped step changed the optimizer state",
    ),
    "UnscalesTwice": (
        "test_gradscaler_follows_the_reference_state_machine",
        "a taken step differs from the optimizer's step",
    ),
    "AllowsDoubleUnscale": (
        "test_gradscaler_follows_the_reference_state_machine",
        "unscale_twice: expected RuntimeError",
    ),
    "StateDictDropsTracker": ("test_gradscaler_follows_the_reference_state_machine", "reload_into_a_fresh_scaler"),
    "BackoffFloorAtOne": (
        "test_finding_the_scale_has_no_floor_and_a_zero_scale_corrupts_parameters",
        "the reference says 0.0",
    ),
}


@pytest.mark.parametrize("bug", sorted(MUST_CATCH))
def test_a_scaler_bug_fails_the_check_that_guards_against_it(pytester, suite_copy, bug):
    suite_copy(*FILES, conftest=False)
    inject(pytester, "scaler", fixtures={"scaler_factory": f"faults.scalers.BROKEN_SCALERS[{bug!r}]"})
    test, text = MUST_CATCH[bug]
    result = pytester.runpytest(*ARGS, "-k", test)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([f"FAILED *{test}*"], consecutive=False)
    assert text in result.stdout.str(), f"{bug}: the failure does not mention {text!r}:\n{result.stdout.str()[-3000:]}"


def test_the_scaler_suite_passes_on_torch_gradscaler_and_on_the_python_reimplementation(pytester, suite_copy):
    """Control of the controls: the un-broken Python re-implementation passes everything."""
    suite_copy(*FILES, conftest=False)
    inject(pytester, "scaler", fixtures={"scaler_factory": "faults.scalers.PyGradScaler"})
    result = pytester.runpytest(*ARGS, "--amp-accept-all")
    assert result.ret == 0, result.stdout.str()
