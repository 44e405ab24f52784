"""Negative controls of the optimizer-implementation and clipping checks: a fused kernel that
ignores GradScaler's ``found_inf``, an unscale kernel that forgets an earlier dtype group's inf,
a lossy foreach kernel, a fused kernel that leaves bf16 and
fp16 parameters as they were, torch 2.13's own fused CPU SGD on them (a real bug, unregistered),
and three broken ``clip_grad_norm_``
(a bf16 reduction, a -1 sentinel for a non-finite norm, ``error_if_nonfinite`` ignored) each fail
exactly the checks named for them (the real suite file, run in a scratch directory with the fault
patched into torch)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_caught, assert_clean, inject, run_inner

FILE = "scaler/test_optimizer_implementations.py"
STEP = "test_every_step_without_overflow_is_the_optimizers_update_in_float64"
OVERFLOW = "test_an_overflow_leaves_parameters_and_state_untouched_and_backs_the_scale_off"
LOW = "test_every_step_of_low_precision_parameters_is_the_update_in_float64_within_their_roundings"
LOW_IDS = ("bfloat16-gradscaler", "bfloat16", "float16")
MIXED = "test_an_overflow_in_one_dtypes_gradients_skips_the_step_for_every_dtype"


def _run(pytester, suite_copy, patches):
    suite_copy(FILE, conftest=False)
    inject(pytester, "scaler", patches=patches)
    return run_inner(pytester)


def test_the_suite_passes_on_torchs_own_optimizers(pytester, suite_copy):
    assert_clean(_run(pytester, suite_copy, None), at_least=24 + 33)


def test_a_fused_kernel_that_leaves_low_precision_parameters_fails_their_check_only(pytester, suite_copy):
    """fp32 parameters step as before, so only the bf16 and fp16 cases of fused Adam fail."""
    run = _run(pytester, suite_copy, {"torch._fused_adam_": "faults.scaler.fused_adam_keeping_low_precision_params"})
    assert_caught(run, *(f"*::{LOW}[[]cpu-Adam-fused-{p}]" for p in LOW_IDS))
    run.stdout.fnmatch_lines(["*|fused Adam on bfloat16 parameters - float64| <= budget*"], consecutive=False)


def test_torch_2_13s_fused_sgd_on_low_precision_parameters_fails_without_its_registry_entry(pytester, suite_copy):
    """Real history: on a release with the bug (2.4 to 2.13), the low-precision check judges fused
    SGD once the registry no longer lists it, and fails it; with the entry it is KNOWN."""
    import torch

    from harness.domains.scaler import optimizers

    if not optimizers.fused_sgd_skips_low_precision_vector_blocks(torch.device("cpu")):
        pytest.skip(f"torch {torch.__version__}'s fused CPU SGD steps bf16 and fp16 parameters: nothing to catch")
    registry = {
        "harness.domains.scaler.known_issues.KNOWN_ISSUES": "faults.scaler.fused_sgd_low_precision_fixed_in_this_release"
    }
    run = _run(pytester, suite_copy, registry)
    assert_caught(run, *(f"*::{LOW}[[]cpu-SGD-fused-{p}]" for p in LOW_IDS))
    run.stdout.fnmatch_lines(["*SGD.fused.bf16_params.step_vs_float64: FAILED*"], consecutive=False)


def test_a_fused_kernel_ignoring_found_inf_fails_the_overflow_check(pytester, suite_copy):
    run = _run(pytester, suite_copy, {"torch._fused_adamw_": "faults.scaler.fused_ignoring_found_inf"})
    assert_caught(
        run,
        f"*::{OVERFLOW}[[]cpu-AdamW-fused]",
        f"*::{STEP}[[]cpu-AdamW-fused]",
        f"*::{MIXED}[[]cpu-AdamW-fused-inf_in_*]",  # an inf in either dtype's gradients, stepped on
    )
    run.stdout.fnmatch_lines(
        ["*AdamW.fused.overflow_untouched: FAILED*", "*step 0 changed parameter*"], consecutive=False
    )


def test_an_unscale_kernel_that_forgets_an_earlier_groups_inf_fails_the_mixed_dtype_check(pytester, suite_copy):
    """found_inf cleared per (device, dtype) group: an inf in the fp32 group (checked first) is
    erased by the finite bf16 group and every optimizer steps on it; an inf in the bf16 group (the
    last) is still found. Only the mixed-dtype check's fp32 cases fail: every other check has
    gradients of one dtype."""
    run = _run(
        pytester,
        suite_copy,
        {"torch._amp_foreach_non_finite_check_and_unscale_": "faults.scaler.foreach_unscale_resetting_found_inf"},
    )
    assert_caught(run, f"*::{MIXED}[[]cpu-*-inf_in_fp32]")
    run.stdout.fnmatch_lines(["*mixed_fp32_inf_untouched: FAILED*"], consecutive=False)


def test_a_lossy_foreach_kernel_fails_the_float64_step_check(pytester, suite_copy):
    run = _run(pytester, suite_copy, {"torch._foreach_addcdiv_": "faults.scaler.foreach_addcdiv_rounding_to_bf16"})
    # fp32 parameters, and fp16 ones (rounded to bf16's 8 bits); bf16 parameters lose nothing
    names = ("Adam", "AdamW", "Adagrad")
    assert_caught(
        run,
        *(f"*::{STEP}[[]cpu-{name}-foreach]" for name in names),
        *(f"*::{LOW}[[]cpu-{name}-foreach-float16]" for name in names),
    )
    run.stdout.fnmatch_lines(["*|foreach Adam - float64| <= budget*"], consecutive=False)


def test_a_torch_whose_fused_sgd_starts_its_momentum_fails_the_registry_as_appears_fixed(pytester, suite_copy):
    """The registered fused-SGD finding is observed on every run: a release where the skipped first
    step leaves no stale momentum reads "appears fixed" and says which registry entry to edit."""
    suite_copy("scaler/test_overflow_in_training.py", conftest=False)
    fixed = "harness.domains.scaler.optimizers.first_step_overflow_uses_uninitialised_momentum"
    inject(
        pytester,
        "scaler",
        fixtures={"scaler_factory": "torch.amp.GradScaler"},
        patches={fixed: "faults.scaler.never_present"},
        imports=("harness.domains.scaler.optimizers",),
    )
    run = run_inner(pytester, "-k", "known_issue")
    assert_caught(run, "*::test_known_issue_status_matches_the_registry[[]cpu-fused-sgd-*]")
    run.stdout.fnmatch_lines(["*appears fixed in torch*KNOWN_ISSUES*fused-sgd*"], consecutive=False)


def test_a_lossy_clip_grad_norm_fails_the_clipping_check(pytester, suite_copy):
    """unscale_ + clip_grad_norm_ is held to clipping computed in float64 from its definition, not
    to torch's own clip_grad_norm_: one whose norm is summed in bf16 fails the state machine."""
    suite_copy("scaler/test_gradscaler_state_machine.py", conftest=False)
    inject(
        pytester,
        "scaler",
        fixtures={"scaler_factory": "torch.amp.GradScaler"},
        patches={"torch.nn.utils.clip_grad_norm_": "faults.scaler.clip_grad_norm_in_bf16"},
    )
    run = run_inner(pytester, "-k", "reference_state_machine")
    assert_caught(run, "*::test_gradscaler_follows_the_reference_state_machine[[]cpu]")
    run.stdout.fnmatch_lines(
        ["*clip_grad_norm_(*) after unscale_ differs from clipping in float64 by*"], consecutive=False
    )


CLIPPING = "scaler/test_clipping.py"
CLIP_TESTS = {
    "vs_float64": "test_clip_grad_norm_after_unscale_is_clipping_in_float64",
    "non_finite": "test_a_non_finite_gradient_gives_a_non_finite_norm_and_gradscaler_skips_the_step",
    "error_if_nonfinite": "test_error_if_nonfinite_raises_and_leaves_the_gradients_as_they_were",
}


def _clipping(pytester, suite_copy, fault):
    suite_copy(CLIPPING, conftest=False)
    patches = None if fault is None else {"torch.nn.utils.clip_grad_norm_": f"faults.scaler.{fault}"}
    inject(pytester, "scaler", patches=patches)
    return run_inner(pytester)


def test_the_clipping_checks_pass_on_torchs_own_clip_grad_norm(pytester, suite_copy):
    assert_clean(_clipping(pytester, suite_copy, None), at_least=6)


@pytest.mark.parametrize(
    ("fault", "check", "message"),
    [
        ("clip_grad_norm_in_bf16", "vs_float64", "*clip.*.vs_float64: FAILED*"),
        ("clip_norm_sentinel", "non_finite", "*returned a finite norm -1*"),
        ("clip_ignoring_error_if_nonfinite", "error_if_nonfinite", "*no error raised*"),
    ],
)
def test_a_broken_clip_grad_norm_fails_exactly_its_clipping_check(pytester, suite_copy, fault, check, message):
    run = _clipping(pytester, suite_copy, fault)
    # a clip whose float16 norm no longer overflows (bf16 accumulation) or comes back as -1 (the
    # sentinel) also changes what the float16 overflow's registry check observes
    changes_fp16_overflow = fault in ("clip_grad_norm_in_bf16", "clip_norm_sentinel")
    assert_caught(
        run,
        *(f"*::{CLIP_TESTS[check]}[[]cpu-{impl}]" for impl in ("for-loop", "foreach")),
        *(["*::test_the_fp16_norm_overflow_status_matches_the_registry*"] if changes_fp16_overflow else []),
    )
    run.stdout.fnmatch_lines([message], consecutive=False)


def test_clipping_float16_gradients_fails_where_their_norm_overflows_without_its_registry_entry(pytester, suite_copy):
    """Real history: on every release from 2.4 to 2.15 float16 gradients of total norm 1e5 clip to
    zero; once the registry no longer lists it, both implementations' cells beyond float16's range
    fail naming the norm, the cells inside it and the bf16 cells pass, and the registry check reads
    the issue as a regression."""
    from harness.domains.scaler import clipping

    if not clipping.fp16_norm_overflows(torch.device("cpu"))[0]:
        pytest.skip(f"torch {torch.__version__} clips float16 gradients of norm 1e5: nothing to catch")
    suite_copy(CLIPPING, conftest=False)
    patch = {
        "harness.domains.scaler.known_issues.KNOWN_ISSUES": "faults.scaler.fp16_clip_overflow_fixed_in_this_release"
    }
    inject(pytester, "scaler", patches=patch)
    run = run_inner(pytester, "-k", "low_precision or fp16_norm")
    low = "test_clip_grad_norm_of_low_precision_gradients_is_clipping_in_float64"
    assert_caught(
        run,
        *(f"*::{low}[[]cpu-{impl}-float16-100000.0]" for impl in ("for-loop", "foreach")),
        "*::test_the_fp16_norm_overflow_status_matches_the_registry*",
    )
    run.stdout.fnmatch_lines(["*clip_grad_norm_ of float16 gradients*"], consecutive=False)
