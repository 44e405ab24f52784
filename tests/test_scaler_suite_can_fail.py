"""Negative controls: plausible GradScaler bugs, injected, make the loss-scaler suite fail, each
caught by the check named here (the message shows which invariant or post-condition it broke)."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers import REPO, assert_caught, assert_clean, inject, run_inner

FILES = ("scaler/test_gradscaler_state_machine.py", "scaler/test_overflow_in_training.py")
#: checks of FILES per scaler a clean run must show passing (the known-issue entries aside)
SCALER_CHECKS = 7

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
    inject(pytester, "scaler", fixtures={"scaler_factory": f"faults.scaler.BROKEN_SCALERS[{bug!r}]"})
    test, text = MUST_CATCH[bug]
    run = run_inner(pytester, "-k", test)
    assert_caught(run, f"*::{test}[[]cpu]")
    assert text in run.stdout.str(), f"{bug}: the failure does not mention {text!r}:\n{run.text()}"
    if test == "test_gradscaler_follows_the_reference_state_machine":
        # the divergence the machine raised is a FAIL row that says what diverged, not only an error
        [row] = [r for r in run.rows if r["metric"] == "rules_run"]
        failure = json.loads(str(row["tags"])).get("failure", "")
        assert row["outcome"] == "fail" and failure.startswith(("Divergence", "AssertionError", "RuntimeError")), row


def _with_stored_traces(pytester) -> None:
    """The repository's golden scale-and-skip traces, so that clean runs are held to them."""
    shutil.copytree(REPO / "baselines" / "scaler", pytester.path / "baselines" / "scaler")


@pytest.mark.amp_thorough  # the suite itself runs on both of torch's scalers in every `pytest suites/`
def test_the_scaler_suite_passes_on_torch_gradscaler_and_sharded_gradscaler(pytester, suite_copy):
    """Control of the controls: torch's own scalers pass every check, against the stored traces."""
    suite_copy(*FILES)  # with the suite's conftest: GradScaler and ShardedGradScaler
    _with_stored_traces(pytester)
    assert_clean(run_inner(pytester, "-k", "not known_issue"), at_least=2 * SCALER_CHECKS)


def test_the_scaler_suite_passes_on_the_python_reimplementation(pytester, suite_copy):
    """Control of the controls: the un-broken Python re-implementation that the faults derive
    from passes every check too, against the same stored traces."""
    suite_copy(*FILES, conftest=False)
    inject(pytester, "scaler", fixtures={"scaler_factory": "faults.scaler.PyGradScaler"})
    _with_stored_traces(pytester)
    assert_clean(run_inner(pytester, "-k", "not known_issue"), at_least=SCALER_CHECKS)


def test_the_state_machine_reaches_the_float32_cap(pytester, suite_copy):
    """Initial scales near the float32 maximum make the model-based test itself catch a scaler
    whose growth is not capped (not only the dedicated single-transition test)."""
    suite_copy(*FILES, conftest=False)
    inject(pytester, "scaler", fixtures={"scaler_factory": "faults.scaler.BROKEN_SCALERS['GrowthNotCapped']"})
    run = run_inner(pytester, "-k", "test_gradscaler_follows_the_reference_state_machine")
    assert_caught(run, "*::test_gradscaler_follows_the_reference_state_machine[[]cpu]")
    assert "reference (torch semantics)" in run.stdout.str() and "inf" in run.stdout.str()


def test_a_fixed_sharded_scaler_makes_the_known_issue_check_say_fixed(pytester, suite_copy):
    """The registry's ShardedGradScaler entry notices a release that fixes the CPU growth cap."""
    import torch.distributed as dist

    suite_copy(*FILES, conftest=False)
    inject(pytester, "scaler", fixtures={"scaler_factory": "faults.scaler.ShardedGradScalerCappedOnCpu"})
    try:
        run = run_inner(pytester, "-k", "known_issue_status and sharded or state_machine")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    out = run.stdout.str()
    assert_caught(
        run,
        "*::test_known_issue_status_matches_the_registry[[]*sharded*]",
        "*::test_gradscaler_follows_the_reference_state_machine[[]cpu]",
        # the growth-cap check expects the registered behaviour of the release too
        "*::test_growth_is_capped_at_the_largest_float32[[]cpu]",
    )
    assert "appears fixed" in out and "sharded-cpu-growth-uncapped" in out, out[-3000:]


# -- the conformance API: declining, exception mapping, versioned semantics --------------------
def _run(machine):
    """Find one counterexample, without shrinking it (the message is the point, not the minimum):
    the negative-control profile, with the conformance suite's step count."""
    from faults import NEGATIVE_CONTROL_PROFILE
    from hypothesis import settings
    from hypothesis.stateful import run_state_machine_as_test

    quick = settings(
        settings.get_profile(NEGATIVE_CONTROL_PROFILE),
        stateful_step_count=30,
        max_examples=60,
        report_multiple_bugs=False,
    )
    run_state_machine_as_test(machine, settings=quick)


def test_an_adapter_that_refuses_a_configuration_without_declining_is_told_how():
    from harness.domains.scaler import reference as R
    from harness.domains.scaler.conformance import conformance_machine

    def refusing(cfg):
        assert cfg.min_scale > 0.0  # as megatron-core's constructor does
        return R.reference_adapter("megatron", cfg)

    with pytest.raises(AssertionError, match=r"raise harness\.domains\.scaler\.reference\.ConfigurationDeclined"):
        _run(conformance_machine(refusing, "megatron"))


def test_a_declining_adapter_passes_and_its_declines_are_counted():
    from collections import Counter

    from harness.domains.scaler import reference as R
    from harness.domains.scaler.conformance import conformance_machine

    def declining(cfg):
        if cfg.min_scale <= 0.0:
            raise R.ConfigurationDeclined("min_scale must be > 0")
        return R.reference_adapter("megatron", cfg)

    counts: Counter[str] = Counter()
    _run(conformance_machine(declining, "megatron", counts))
    assert counts["declined"] > 0 and counts["examples"] > 0, dict(counts)


def test_an_unmapped_at_minimum_exception_is_a_failure_that_names_the_mapping():
    from harness.domains.scaler import reference as R
    from harness.domains.scaler.conformance import conformance_machine

    class PlainException(R.DeepSpeedAdapter):
        def update(self, found_inf):
            try:
                super().update(found_inf)
            except R.ScalerAtMinimumError as exc:
                raise Exception(str(exc)) from None  # DeepSpeed raises a plain Exception

    def make(cfg):
        return PlainException(R.reference_adapter("deepspeed>=0.17.1", cfg).impl)

    with pytest.raises(
        AssertionError, match=r"translate it into harness\.domains\.scaler\.reference\.ScalerAtMinimumError"
    ):
        _run(conformance_machine(make, "deepspeed>=0.17.1"))


@pytest.mark.parametrize(
    ("framework", "version", "semantics"),
    [
        ("deepspeed", "0.16.4", "deepspeed<=0.17.0"),
        ("deepspeed", "0.17.0", "deepspeed<=0.17.0"),
        ("deepspeed", "0.17.1", "deepspeed>=0.17.1"),
        ("deepspeed", "0.19.8+cpu", "deepspeed>=0.17.1"),
        ("megatron-core", "0.16.1", "megatron"),
    ],
)
def test_semantics_follow_the_release(framework, version, semantics):
    from harness.domains.scaler.reference import semantics_for

    assert semantics_for(framework, version) == semantics


def test_an_unknown_framework_is_refused_with_the_choices():
    from harness.domains.scaler.reference import semantics_for

    with pytest.raises(ValueError, match="known: apex, deepspeed, megatron-core, torch"):
        semantics_for("colossalai", "0.4.0")


def test_an_adapter_that_declines_most_configurations_is_inconclusive_not_a_pass():
    """The claim that keeps a mostly-declining adapter from passing: DeepSpeed's half (it declines
    the machine's growth 4 by design) counts; an adapter that accepts one in five does not."""
    from collections import Counter

    from harness.domains.scaler.conformance import judge_accepted
    from harness.numerics.comparison import Outcome

    half = judge_accepted("deepspeed", Counter(examples=45, declined=51))
    assert half.passed, half
    few = judge_accepted("deepspeed", Counter(examples=12, declined=48))
    assert not few.passed and few.outcome is Outcome.INCONCLUSIVE, few
    assert not judge_accepted("deepspeed", Counter()).passed


def test_a_divergence_is_told_by_its_type_never_by_its_words():
    """Which failures keep a script is decided on the typed divergence (``Diverged``): found inside
    the exception group hypothesis raises for distinct failures, and never read back from a message."""
    import builtins

    from harness.domains.scaler import reference as scaling

    # the builtin from Python 3.11, the backport hypothesis depends on before it
    group = getattr(builtins, "ExceptionGroup", None) or __import__("exceptiongroup").ExceptionGroup
    found = scaling.Divergence(scaling.Diverged.STATE, "scaler scale 2.0, specification 1.0")
    assert scaling.divergence_in(group("distinct failures", [ValueError("other"), found])) is found
    assert scaling.divergence_in(AssertionError("scaler (scale, growth_tracker) = (2.0, 0)")) is None


def test_a_fixed_known_issue_that_comes_back_is_a_regression(pytester, suite_copy):
    """The lifecycle's negative control: a registry saying update(int) was fixed in this very
    release, on a stack that still has the bug, fails the registry check as a regression."""
    suite_copy("scaler/test_overflow_in_training.py", conftest=False)
    inject(
        pytester,
        "scaler",
        fixtures={"scaler_factory": "torch.amp.GradScaler"},
        patches={"harness.domains.scaler.known_issues.KNOWN_ISSUES": "faults.scaler.fixed_in_this_release"},
    )
    run = run_inner(pytester, "-k", "known_issue_status and update-int")
    assert_caught(run, "*::test_known_issue_status_matches_the_registry[[]cpu-update-int-new-scale]")
    run.stdout.fnmatch_lines(["*was fixed in torch*occurs again*a regression*"], consecutive=False)


def test_an_open_known_issue_in_a_release_newer_than_any_listed_is_known_not_failed(pytester, suite_copy):
    """An open issue still present in a release the registry has never seen is KNOWN: the row says
    it is still there and which field to bump."""
    suite_copy("scaler/test_overflow_in_training.py", conftest=False)
    inject(
        pytester,
        "scaler",
        fixtures={"scaler_factory": "torch.amp.GradScaler"},
        patches={"harness.domains.scaler.known_issues.KNOWN_ISSUES": "faults.scaler.verified_long_ago"},
    )
    run = run_inner(pytester, "-k", "known_issue_status and update-int")
    assert_clean(run, at_least=1)
    [row] = [r for r in run.rows if r["metric"] == "known_issue.update-int-new-scale"]
    assert row["outcome"] == "known", row
    assert "still present in torch" in json.loads(str(row["tags"]))["lifecycle"]
