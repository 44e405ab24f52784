"""Negative controls of the AMP-patterns suite: each broken implementation fails exactly the checks
named for it, through the one control helper. The clean suite and the compiled fault's clean twin
pass in the thorough tier (`pytest suites/` runs the clean suite by default)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_caught, assert_clean, inject, run_inner

FILES = (
    "patterns/test_checkpointing.py",
    "patterns/test_custom_functions.py",
    "patterns/test_resume.py",
    "patterns/test_multiple_optimizers.py",
    "patterns/test_gradient_penalty.py",
    "patterns/test_accumulation.py",
)
GRADIENTS = "test_checkpointed_gradients_equal_the_unchecked_models_bit_for_bit"
OVERFLOW = "test_an_overflow_in_a_recomputed_block_skips_the_step_and_backs_off_once"
PARTITIONED = "test_checkpointed_blocks_partitioned_by_the_compiler_give_its_unchecked_gradients_bit_for_bit"
CUSTOM = "test_a_custom_functions_matmuls_run_in_the_precision_its_decorators_promise"
SHARED = "test_a_layer_in_two_checkpointed_regions_gets_the_unchecked_models_gradients_bit_for_bit"
SELECTIVE_SHARED = "selective-checkpoint-shared-weight-cast-cache"
PENALTY = "test_the_penalty_is_the_float64_norm_of_the_unscaled_gradients"
ACCUMULATED = "test_the_accumulated_gradient_is_the_float64_sum_of_the_micro_batches"
NO_SYNC = "test_under_no_sync_the_synchronised_gradient_is_the_float64_average_of_the_ranks_sums"
NO_SYNC_OVERFLOW = "test_under_no_sync_an_inf_on_one_rank_skips_the_step_on_every_rank"
ACCUMULATION_OVERFLOW = "test_an_inf_in_any_micro_batch_skips_the_effective_batch_and_backs_off_once"
PENALISED_STEP = "test_the_penalised_step_equals_the_step_without_loss_scaling_bit_for_bit"


def _run(pytester, suite_copy, patches: dict[str, str], *args: str):
    suite_copy(*FILES, conftest=False)
    inject(pytester, "patterns", patches=patches)
    return run_inner(pytester, *args)


@pytest.mark.amp_thorough  # the suite run `pytest suites/` makes: each control below runs it with one fault
def test_the_clean_patterns_suite_passes(pytester, suite_copy):
    assert_clean(_run(pytester, suite_copy, {}), at_least=37)


def test_a_recompute_outside_autocast_fails_every_checkpointing_form(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"torch.utils.checkpoint.checkpoint": "faults.patterns.recompute_outside_autocast"},
        "-k",
        "checkpoint",
    )
    # the gradients differ (4 forms x bf16, fp16; with a shared layer 3 x 2); the fp16 overflow step's
    # recompute raises; traced by the compiler (2 forms x bf16: fp16's are thorough on the CPU), the
    # recompute meets bf16 and fp32; SAC's replay no longer misses the shared layer's cast, which
    # the registry check reads as the issue gone while listed
    assert_caught(
        run,
        f"*::{GRADIENTS}[[]*]",
        f"*::{OVERFLOW}[[]*]",
        f"*::{PARTITIONED}[[]cpu-bf16-*]",
        f"*::{SHARED}[[]*]",
        f"*::test_known_issue_status_matches_the_registry[[]*-{SELECTIVE_SHARED}]",
    )
    assert len(run.failed) == 21, sorted(run.failed)
    run.stdout.fnmatch_lines(["*differ from the model without checkpointing*"], consecutive=False)


def test_a_custom_fwd_that_ignores_cast_inputs_fails_the_fp32_function(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"torch.amp.custom_fwd": "faults.patterns.custom_fwd_ignoring_cast_inputs"},
        "-k",
        "custom",
    )
    assert_caught(run, f"*::{CUSTOM}[[]cpu-*-fp32-ctx]")
    run.stdout.fnmatch_lines(["*forward mm in bfloat16*"], consecutive=False)


def test_a_custom_bwd_that_drops_the_forwards_autocast_fails_the_autocast_function(pytester, suite_copy):
    run = _run(
        pytester, suite_copy, {"torch.amp.custom_bwd": "faults.patterns.custom_bwd_without_autocast"}, "-k", "custom"
    )
    # the setup_context form too: its backward now meets the low-precision gradient and raises on its
    # own (not the registered issue's AttributeError), which the registry check reads as the issue gone
    assert_caught(run, f"*::{CUSTOM}[[]cpu-*-autocast-*]", "*::test_known_issue_status_matches_the_registry*")
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


def test_kernels_that_are_not_deterministic_make_every_bitwise_check_noisy_never_a_pass(pytester, suite_copy):
    """Where the reference does not repeat bit for bit (a GPU's atomics), bit for bit is no verdict:
    each bitwise cell of this process records a NOISY row naming what moved and skips; none passes,
    none fails. (The FSDP2 cells' ranks are other processes, which the patch does not reach; the
    Inductor cells and the partitioned fp16 cells are thorough on the CPU.)"""
    patch = {"torch.nn.functional.linear": "faults.patterns.nondeterministic"}
    selected = "bit_for_bit and not fsdp2 and not compiled_checkpointed and not (partitioned and fp16)"
    # the moving kernel runs outside the compiled graphs (a graph break), and Dynamo, resuming after
    # it on a non-leaf tensor, reads its .grad (torch's warning, an error in the suites)
    grad_warning = "ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning"
    run = _run(pytester, suite_copy, patch, "-k", selected, "-W", grad_warning)
    noisy = {r["nodeid"] for r in run.rows if r["outcome"] == "noisy"}
    assert not run.failed and not run.passed, run.text()
    # 18 eager cells (4 forms x 2 dtypes, 3 shared-layer forms x 2, the penalised step and the resumed
    # run x 2) and 2 partitioned
    partitioned = {t for t in run.skipped if PARTITIONED in t}
    assert len(run.skipped) == 20 and len(partitioned) == 2, (sorted(run.skipped), run.text())
    assert run.skipped <= noisy, (sorted(run.skipped - noisy), run.text())
    notes = {r["note"].split(" (")[0] for r in run.rows if r["outcome"] == "noisy"}
    assert notes == {"the reference, run twice on this device, differed"}, notes


def test_an_update_per_optimizer_fails_the_two_optimizer_pattern(pytester, suite_copy):
    run = _run(
        pytester, suite_copy, {"torch.amp.GradScaler.step": "faults.patterns.update_per_optimizer"}, "-k", "optimizer"
    )
    assert_caught(run, "*::test_each_optimizer_decides_its_own_skip_and_the_scale_backs_off_once[[]cpu-*]")


def test_a_penalty_left_scaled_fails_the_penalised_step(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"harness.domains.patterns.penalty.unscale_by_hand": "faults.patterns.penalty_left_scaled"},
        "-k",
        "penalty or penalised",
    )
    assert_caught(run, f"*::{PENALISED_STEP}[[]cpu-*]")
    run.stdout.fnmatch_lines(["*differ from the unscaled step's*"], consecutive=False)


def test_a_penalty_summed_in_half_fails_the_float64_penalty(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"harness.domains.patterns.penalty.penalty_of": "faults.patterns.penalty_in_half"},
        "-k",
        "penalty or penalised",
    )
    assert_caught(run, f"*::{PENALTY}[[]cpu-*]")
    run.stdout.fnmatch_lines(["*not computed in fp32 from the unscaled gradients*"], consecutive=False)


def test_a_scale_changed_inside_the_effective_batch_fails_the_accumulated_gradient(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"harness.domains.patterns.accumulation.accumulate": "faults.patterns.rescaled_mid_batch"},
        "-k",
        "accumulated_gradient",
    )
    assert_caught(run, f"*::{ACCUMULATED}[[]cpu-*]")
    run.stdout.fnmatch_lines(["*scales after each micro-batch: *2048.0*"], consecutive=False)


def test_stepping_every_micro_batch_fails_the_skip_of_the_effective_batch(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"harness.domains.patterns.accumulation.accumulate": "faults.patterns.step_every_micro_batch"},
        "-k",
        "inf_in_any_micro_batch",
    )
    # wherever the inf is, the other micro-batches' steps are taken
    assert_caught(run, f"*::{ACCUMULATION_OVERFLOW}[[]cpu-micro_batch_*]")
    assert len(run.failed) == 4, sorted(run.failed)
    run.stdout.fnmatch_lines(["*the step changed parameters or optimizer state*"], consecutive=False)


def test_ranks_that_never_leave_no_sync_fail_the_synchronised_gradient_and_the_skip(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"harness.domains.patterns.rank_programs.NO_SYNC": "faults.distributed.no_sync_never_ending"},
        "-k",
        "no_sync",
    )
    assert_caught(run, f"*::{NO_SYNC}", f"*::{NO_SYNC_OVERFLOW}[[]*]")
    run.stdout.fnmatch_lines(["*rank 1's gradients differ from rank 0's*"], consecutive=False)


def test_a_recompute_outside_autocast_inside_fsdp2_units_fails_both_dtypes(pytester, suite_copy):
    run = _run(
        pytester,
        suite_copy,
        {"harness.domains.patterns.rank_programs.CHECKPOINT": "faults.distributed.checkpoint_in_fp32"},
        "-k",
        "fsdp2",
    )
    assert_caught(run, "*::test_checkpointed_blocks_inside_fsdp2_units_give_the_unchecked_gradients_bit_for_bit[[]*]")
    assert len(run.failed) == 2, sorted(run.failed)
    run.stdout.fnmatch_lines(["*the checkpointed backward raised*"], consecutive=False)


COMPILED = "test_compiled_checkpointed_blocks_give_the_compiled_unchecked_gradients_bit_for_bit"


_BACKENDS = tuple(f"harness.domains.patterns.checkpointing.{b}" for b in ("COMPILE_BACKEND", "PARTITION_BACKEND"))
#: fp16's cells take the same code path
_COMPILED_ARGS = ("-k", "(compiled_checkpointed or partitioned) and bf16", "--amp-tier=thorough")


def test_a_compiled_recompute_in_fp32_fails_every_compiled_form(pytester, suite_copy):
    """Through the compiler: an AOTAutograd backend whose partitioned backward recomputes the
    checkpointed regions in fp32 (no Inductor: the graphs run as traced, in a second), in place of
    Inductor and of the partitioned cells' backend."""
    faulty = dict.fromkeys(_BACKENDS, "faults.compiled.recompute_in_fp32_backend")
    run = _run(pytester, suite_copy, faulty, *_COMPILED_ARGS)
    assert_caught(run, f"*::{COMPILED}[[]cpu-bf16-*]", f"*::{PARTITIONED}[[]cpu-bf16-*]")
    assert len(run.failed) == 4, sorted(run.failed)  # non-reentrant and selective, in each cell


@pytest.mark.amp_thorough  # a second inner run; by default the partitioned cells' own backend passes them
def test_the_fp32_recompute_backends_clean_twin_passes_every_compiled_form(pytester, suite_copy):
    """The same backend without the fp32 recompute passes the cells it fails: the failures above
    come from the recompute, not from replacing Inductor."""
    clean = dict.fromkeys(_BACKENDS, "faults.compiled.clean_passes_backend")
    assert_clean(_run(pytester, suite_copy, clean, *_COMPILED_ARGS), at_least=4)


def test_a_setup_context_function_fails_the_custom_function_check_without_its_registry_entry(pytester, suite_copy):
    """Real history: on a release with the bug (every release from 2.4 to 2.15), the setup_context
    cells are judged once the registry no longer lists it and fail naming custom_bwd's missing
    state; the ctx form passes; the registry check reads the issue as a regression."""
    from harness.domains.patterns import custom_functions

    if not custom_functions.setup_context_issue(torch.device("cpu"))[0]:
        pytest.skip(f"torch {torch.__version__} restores a setup_context function's autocast state: nothing to catch")
    registry = "harness.domains.patterns.known_issues.KNOWN_ISSUES"
    run = _run(pytester, suite_copy, {registry: "faults.patterns.setup_context_fixed_in_this_release"}, "-k", "custom")
    assert_caught(run, f"*::{CUSTOM}[[]cpu-*-setup_context]", "*::test_known_issue_status_matches_the_registry*")
    assert len(run.failed) == 5, sorted(run.failed)  # 2 decorations x 2 dtypes, and the registry check
    run.stdout.fnmatch_lines(["*backward raised AttributeError*_fwd_used_autocast*"], consecutive=False)


def test_the_shared_layer_forms_fail_without_their_registry_entries(pytester, suite_copy):
    """Real history: selective checkpointing of a shared layer (2.13 on) and ``checkpoint_sequential``
    over a repeated module (every release) are judged once the registry no longer lists them: both
    forms fail in both dtypes, non-reentrant checkpointing passes, both registry checks fail."""
    from harness.domains.patterns import checkpointing

    if not checkpointing.sequential_drops_repeats()[0]:
        pytest.skip(f"torch {torch.__version__} runs a repeated module under checkpoint_sequential: nothing to catch")
    registry = "harness.domains.patterns.known_issues.KNOWN_ISSUES"
    patch = {registry: "faults.patterns.shared_layer_issues_fixed_in_this_release"}
    run = _run(pytester, suite_copy, patch, "-k", "two_checkpointed or registry")
    expected = [
        f"*::{SHARED}[[]cpu-*-sequential]",
        "*::test_known_issue_status_matches_the_registry[[]*-checkpoint-seq*]",
    ]
    # selective checkpointing's replay misses the shared layer's cast from 2.13 on: observed here
    cpu = torch.device("cpu")
    sac = checkpointing.missing("selective") is None and checkpointing.replay_lost_a_cast(
        checkpointing.gradients("selective", cpu, torch.bfloat16, 1.0, shared=True)
    )
    if sac:
        expected += [
            f"*::{SHARED}[[]cpu-*-selective]",
            f"*::test_known_issue_status_matches_the_registry[[]*-{SELECTIVE_SHARED}]",
        ]
    assert_caught(run, *expected)
    assert not [t for t in run.failed if "non_reentrant" in t]
    run.stdout.fnmatch_lines(
        ["*sequential checkpointing of a layer used twice*differ from the model*"], consecutive=False
    )


def test_a_recompute_around_the_fsdp2_units_cast_fails_the_policy_cells_and_the_registry(pytester, suite_copy):
    """What 2.7 to 2.12 did, on a release that fixed it: the recomputation calls each unit's forward
    around its hooks, so the policy's cast of the fp32 table does not run; both dtypes' policy cells
    fail naming the checkpointed backward, the registry check reads the issue present outside its
    range, the autocast form (its units inside the checkpointed pairs, their hooks run) passes."""
    from harness.domains.patterns import known_issues

    issue = known_issues.KNOWN_ISSUES[known_issues.FSDP2_POLICY_RECOMPUTE]
    if issue.listed(torch.__version__, "cpu"):
        pytest.skip(f"torch {torch.__version__} has the issue: its cells are KNOWN, the clean run shows it")
    patch = {"harness.domains.patterns.rank_programs.CHECKPOINT": "faults.distributed.checkpoint_around_module_hooks"}
    run = _run(pytester, suite_copy, patch, "-k", "fsdp2")
    policy = "test_checkpointed_fsdp2_units_under_a_mixed_precision_policy_give_the_unchecked_gradients_bit_for_bit"
    assert_caught(run, f"*::{policy}[[]*]", "*::test_fsdp2_known_issue_status_matches_the_registry")
    assert len(run.failed) == 3, sorted(run.failed)
    run.stdout.fnmatch_lines(["*the checkpointed backward raised*"], consecutive=False)
