"""Negative controls of the AMP-patterns suite: each broken implementation fails exactly the checks
named for it, through the one control helper; the clean suite passes."""

from __future__ import annotations

from helpers import assert_caught, assert_clean, inject, run_inner

FILES = (
    "patterns/test_checkpointing.py",
    "patterns/test_custom_functions.py",
    "patterns/test_resume.py",
    "patterns/test_multiple_optimizers.py",
)
GRADIENTS = "test_checkpointed_gradients_equal_the_unchecked_models_bit_for_bit"
OVERFLOW = "test_an_overflow_in_a_recomputed_block_skips_the_step_and_backs_off_once"
CUSTOM = "test_a_custom_functions_matmuls_run_in_the_precision_its_decorators_promise"


def _run(pytester, suite_copy, patches: dict[str, str], *args: str):
    suite_copy(*FILES, conftest=False)
    inject(pytester, "patterns", patches=patches)
    return run_inner(pytester, *args)


def test_the_clean_patterns_suite_passes(pytester, suite_copy):
    assert_clean(_run(pytester, suite_copy, {}), at_least=21)


def test_a_recompute_outside_autocast_fails_every_checkpointing_form(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"torch.utils.checkpoint.checkpoint": "faults.patterns.recompute_outside_autocast"},
        "-k",
        "checkpoint",
    )
    # the gradients differ (4 forms x bf16, fp16); the fp16 overflow step's recompute raises
    assert_caught(run, f"*::{GRADIENTS}[[]*]", f"*::{OVERFLOW}[[]*]")
    assert len(run.failed) == 12, sorted(run.failed)
    run.stdout.fnmatch_lines(["*differ from the model without checkpointing*"], consecutive=False)


def test_a_custom_fwd_that_ignores_cast_inputs_fails_the_fp32_function(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"torch.amp.custom_fwd": "faults.patterns.custom_fwd_ignoring_cast_inputs"},
        "-k",
        "custom",
    )
    assert_caught(run, f"*::{CUSTOM}[[]cpu-*-fp32]")
    run.stdout.fnmatch_lines(["*forward mm in bfloat16*"], consecutive=False)


def test_a_custom_bwd_that_drops_the_forwards_autocast_fails_the_autocast_function(pytester, suite_copy):
    run = _run(
        pytester, suite_copy, {"torch.amp.custom_bwd": "faults.patterns.custom_bwd_without_autocast"}, "-k", "custom"
    )
    assert_caught(run, f"*::{CUSTOM}[[]cpu-*-autocast]")
    run.stdout.fnmatch_lines(["*backward raised RuntimeError*"], consecutive=False)


def test_a_scaler_whose_state_is_not_restored_fails_the_resumed_fp16_run(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"torch.amp.GradScaler.load_state_dict": "faults.patterns.scaler_state_not_restored"},
        "-k",
        "resume",
    )
    assert_caught(run, "*::test_a_resumed_run_continues_bit_for_bit_as_the_uninterrupted_one[[]cpu-fp16]")
    run.stdout.fnmatch_lines(["*step 4: scale 1024.0 vs 256.0*"], consecutive=False)


def test_an_update_per_optimizer_fails_the_two_optimizer_pattern(pytester, suite_copy):
    run = _run(
        pytester, suite_copy, {"torch.amp.GradScaler.step": "faults.patterns.update_per_optimizer"}, "-k", "optimizer"
    )
    assert_caught(run, "*::test_each_optimizer_decides_its_own_skip_and_the_scale_backs_off_once[[]cpu-*]")
