"""Negative controls: plausible autocast regressions, injected, make the autocast suite fail.

The real suite files run in a scratch directory; a first clean run writes their baselines, then a
conftest patches torch (only inside autocast regions) the way a regression would.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import assert_caught, assert_clean, inject, run_inner

from harness.domains.autocast import banned
from harness.domains.autocast.repro import banned_repro
from harness.numerics.comparison import explain

POLICY = "autocast/test_op_policy.py"
NUMERICS = "autocast/test_op_numerics.py"
#: policy checks a clean run must show passing: 2 + 5 checks x (bf16, fp16); the CUDA-only one skips
POLICY_CHECKS = 12


@pytest.fixture(scope="module")
def clean_policy_baselines(tmp_path_factory) -> dict[str, Path]:
    """Where the first clean run's baselines are kept, so that later tests copy them (each run of
    the policy suite costs several seconds on 2 cores)."""
    return {}


@pytest.fixture
def policy_with_baselines(pytester, suite_copy, clean_policy_baselines, tmp_path_factory):
    suite_copy(POLICY, conftest=False)
    if "dir" in clean_policy_baselines:
        shutil.copytree(clean_policy_baselines["dir"], pytester.path / "baselines")
        return pytester
    first = run_inner(pytester, "-k", "golden_table or registered_autocast_ops_match")
    assert "Baseline missing" in first.stdout.str()
    assert_clean(run_inner(pytester), at_least=POLICY_CHECKS)  # the control of the controls
    kept = tmp_path_factory.mktemp("policy-baselines") / "baselines"
    shutil.copytree(pytester.path / "baselines", kept)
    clean_policy_baselines["dir"] = kept
    return pytester


def test_an_fp32_op_run_in_low_precision_fails_the_policy_table_with_a_per_op_diff(policy_with_baselines):
    inject(
        policy_with_baselines,
        "autocast",
        patches={"torch.nn.functional.layer_norm": "faults.autocast.layer_norm_in_low_precision"},
    )
    run = run_inner(policy_with_baselines)
    run.stdout.fnmatch_lines(
        [
            "*Baseline mismatch: baselines/autocast/torch-*/policy_cpu_bfloat16.json*",
            "*nn.LayerNorm.fp32_in: expected 'float32', got 'bfloat16' (changed)*",
            "*regenerate the baseline: pytest *test_op_policy.py::test_op_policy_matches_the_golden_table?cpu-bf16?* --amp-regen",
        ],
        consecutive=False,
    )
    assert_caught(run, *(f"*::test_op_policy_matches_the_golden_table[[]cpu-{d}]" for d in ("bf16", "fp16")))


#: regression -> (patched torch attribute, faults.autocast factory, checks selected, line the failure shows)
POLICY_REGRESSIONS = {
    "low-precision op left in fp32": (
        "torch.nn.functional.linear",
        "linear_skips_autocast",
        "golden_table",
        "*nn.Linear.fp32_in: expected 'bfloat16', got 'float32' (changed)*",
    ),
    "cast cache dropped": (
        "torch.nn.functional.linear",
        "cast_cache_cleared",
        "cast_once",
        "*the fp32 weight was cast 6 times in 2 autocast regions of 3 calls each (expected 2)*",
    ),
    "float64 inputs cast": (
        "torch.mm",
        "float64_cast",
        "never_cast",
        "*input 'torch.mm(float64)': expected torch.float64, got torch.bfloat16*",
    ),
}


@pytest.mark.parametrize("regression", sorted(POLICY_REGRESSIONS))
def test_a_policy_regression_fails_the_check_that_guards_against_it(policy_with_baselines, regression):
    target, factory, selection, line = POLICY_REGRESSIONS[regression]
    inject(policy_with_baselines, "autocast", patches={target: f"faults.autocast.{factory}"})
    run = run_inner(policy_with_baselines, "-k", selection)
    assert_caught(run, f"*{selection}*[[]cpu-bf16]", f"*{selection}*[[]cpu-fp16]")
    run.stdout.fnmatch_lines([line], consecutive=False)


def test_an_autocast_that_ignores_enabled_false_fails_the_nested_region_check(policy_with_baselines):
    inject(policy_with_baselines, "autocast", patches={"torch.autocast": "faults.autocast.autocast_ignoring_disable"})
    run = run_inner(policy_with_baselines, "-k", "nested")
    assert_caught(run, "*nested*[[]cpu-bf16]", "*nested*[[]cpu-fp16]")
    run.stdout.fnmatch_lines(["*input 'inner': expected torch.float32, got torch.*16*"], consecutive=False)


@pytest.mark.parametrize(
    ("target", "factory", "case"),
    [
        ("torch.nn.functional.layer_norm", "layer_norm_in_low_precision", "layer_norm"),
        ("torch.mm", "mm_accumulates_in_low_precision", "mm"),
    ],
)
def test_a_numerics_regression_exceeds_the_derived_budget(pytester, suite_copy, target, factory, case):
    suite_copy(NUMERICS, conftest=False)
    inject(pytester, "autocast", patches={target: f"faults.autocast.{factory}"})
    run = run_inner(pytester, "-k", f"derived_budget and -{case}]")
    assert_caught(run, f"*derived_budget*bf16-{case}]", f"*derived_budget*fp16-{case}]")
    run.stdout.fnmatch_lines(
        ["*under autocast(cpu, *): FAILED: mismatched elements:*", "*greatest error/budget:*"], consecutive=False
    )


def _refusing(*args: object, **kwargs: object) -> None:
    raise RuntimeError("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.")


def test_the_bce_ban_fails_where_binary_cross_entropy_runs_and_its_script_agrees(monkeypatch):
    """The CUDA-only ban's verdict and script, held on the CPU: CPU autocast runs
    binary_cross_entropy (what a CUDA stack that lost the ban would do), so the claim fails and its
    script measures 1; a binary_cross_entropy raising autocast's refusal passes both."""
    cpu = torch.device("cpu")

    def script_measures() -> int:
        repro = banned_repro(cpu, torch.float16)
        namespace: dict[str, object] = {"torch": torch}
        exec(compile(repro.code, "<autocast banned script>", "exec"), namespace)
        assert namespace["allowed"] == 0
        return int(namespace["measured"])  # type: ignore[call-overload]

    ran = banned.bce_banned_claim(cpu, torch.float16)
    assert not ran.passed and "returned float32" in explain(ran)
    assert script_measures() == 1
    monkeypatch.setattr(torch.nn.functional, "binary_cross_entropy", _refusing)
    assert banned.bce_banned_claim(cpu, torch.float16).passed
    assert script_measures() == 0


def test_an_autocast_that_leaves_a_fused_ops_inner_op_uncast_fails_the_fast_path_and_registry_checks(
    pytester, suite_copy
):
    """torch 2.4/2.5's CPU autocast, re-created on this release: _addmm_activation passes its
    operands through uncast, so the encoder layer's fused inference raises. Its fast-path cells fail
    (the registry does not list the issue for this release) and the registry check fails as "present
    outside its range"; MultiheadAttention's fast path does not call it and passes."""
    suite_copy("autocast/test_module_fast_paths.py", conftest=False)
    inject(pytester, "", imports=("faults.stacks", "torch"), kernels=("addmm_activation_autocast_uncast",))
    run = run_inner(pytester)
    assert_caught(
        run,
        "*::test_a_modules_inference_fast_path_runs_under_autocast[[]cpu-*-TransformerEncoderLayer*]",
        "*::test_known_issue_status_matches_the_registry*",
    )
    run.stdout.fnmatch_lines(["*raised: mat1 and mat2 must have the same dtype*"], consecutive=False)


def test_a_cache_that_reuses_grad_free_casts_fails_the_cast_cache_and_registry_checks(pytester, suite_copy):
    """torch 2.4 to 2.10's weight cache, re-created on this release for nn.Linear: a cast made under
    no_grad is reused by the training pass, whose Linear weights then get no gradient. Both grad-free
    forms fail (the registry does not list the issue for this release), naming the weights, and the
    registry check fails as "present outside its range"."""
    suite_copy("autocast/test_cast_cache.py", conftest=False)
    inject(
        pytester, "autocast", patches={"torch.nn.functional.linear": "faults.autocast.linear_reusing_grad_free_casts"}
    )
    run = run_inner(pytester)
    assert_caught(
        run,
        *(f"*::test_a_module_trained_after_a_grad_free_pass_*[[]cpu-*-{g}]" for g in ("no_grad", "inference_mode")),
        "*::test_known_issue_status_matches_the_registry*",
    )
    run.stdout.fnmatch_lines(["*no_grad pass*: no gradient for 0.weight, 0.bias, 3.weight, 3.bias*"], consecutive=False)


def _without_its_registry_entry(pytester, suite_copy, suite: str, issue: str):
    """``suites/autocast/<suite>`` run with the registry saying ``issue`` was fixed in this release
    (``faults.autocast.<issue>_fixed_in_this_release``): its cells are judged as without the entry."""
    suite_copy(f"autocast/{suite}", conftest=False)
    fixed = f"faults.autocast.{issue}_fixed_in_this_release"
    inject(pytester, "autocast", patches={"harness.domains.autocast.known_issues.KNOWN_ISSUES": fixed})
    return run_inner(pytester)


def test_a_vmapped_bias_left_in_fp32_fails_the_vmap_check_without_its_registry_entry(pytester, suite_copy):
    """Real history: on a release with the bug (every release from 2.4 to 2.15), the vmap check judges
    the modules with a bias once the registry no longer lists it, and fails them naming both dtypes;
    the Linear without a bias passes; the registry check reads the issue as a regression."""
    from harness.domains.autocast import vmapped

    if not vmapped.issue_present(torch.device("cpu"))[0]:
        pytest.skip(f"torch {torch.__version__} keeps a vmapped bias in the autocast dtype: nothing to catch")
    run = _without_its_registry_entry(pytester, suite_copy, "test_vmap_policy.py", "vmap_bias")
    assert_caught(
        run,
        *(f"*::test_a_module_under_vmap_gets_*[[]cpu-*-{m}]" for m in ("Linear", "Conv2d", "MLP")),
        "*::test_known_issue_status_matches_the_registry*",
    )
    run.stdout.fnmatch_lines(
        ["*Linear under torch.bfloat16 autocast: unbatched torch.bfloat16, vmapped torch.float32*"], consecutive=False
    )
    assert not [t for t in run.failed if "Linear.no_bias" in t]


NESTED = "test_a_nested_region_of_another_dtype_computes_in_its_dtype"


def test_stale_casts_in_a_nested_region_fail_the_nested_check_without_its_registry_entry(pytester, suite_copy):
    """Real history: on a release with the bug, the nested-region check judges the modules the outer
    region used once the registry no longer lists it, a raised matmul and a silent outer dtype both;
    the layer first used inside passes; the registry check reads the issue as a regression."""
    from harness.domains.autocast import nested_dtypes

    if not nested_dtypes.issue_present(torch.device("cpu"))[0]:
        pytest.skip(f"torch {torch.__version__} casts afresh in a nested region of another dtype: nothing to catch")
    run = _without_its_registry_entry(pytester, suite_copy, "test_nested_regions.py", "nested_dtype")
    assert_caught(
        run,
        *(f"*::{NESTED}[[]cpu-*-{m}]" for m in ("Linear", "adapter_product")),
        "*::test_known_issue_status_matches_the_registry*",
    )
    run.stdout.fnmatch_lines(["*adapter_product, torch.float16 nested in torch.bfloat16: torch.bfloat16 in the nested*"],
                             consecutive=False)  # fmt: skip
    assert len([t for t in run.failed if NESTED in t]) == 4


def test_a_nested_region_that_keeps_the_outer_dtype_fails_the_layer_first_used_inside(pytester, suite_copy):
    """A release whose nested region never switches precision: the layer the outer region had not
    used, which the cache cannot explain, fails in both dtypes, naming the outer one."""
    suite_copy("autocast/test_nested_regions.py", conftest=False)
    inject(pytester, "autocast", patches={"torch.autocast": "faults.autocast.nested_region_keeps_outer_dtype"})
    run = run_inner(pytester)
    assert_caught(run, f"*::{NESTED}[[]cpu-*-Linear.first_inside]")
    assert len(run.failed) == 2
    run.stdout.fnmatch_lines(["*Linear.first_inside, torch.float16 nested in torch.bfloat16: torch.bfloat16 in*"],
                             consecutive=False)  # fmt: skip


UPDATED = "test_a_forward_after_an_in_place_update_computes_with_the_updated_parameters"


def test_casts_stale_after_an_update_fail_the_check_without_its_registry_entry(pytester, suite_copy):
    """Real history: on a release that serves the casts cached before an in-place update, the check
    judges both updates inside a region once the registry no longer lists it, in both dtypes; the
    updates between regions pass; the registry check reads the issue as a regression."""
    from harness.domains.autocast import in_place_updates

    if not in_place_updates.issue_present(torch.device("cpu"))[0]:
        pytest.skip(f"torch {torch.__version__} sees an update inside the region: nothing to catch")
    run = _without_its_registry_entry(pytester, suite_copy, "test_in_place_updates.py", "stale_casts")
    assert_caught(run, f"*::{UPDATED}[[]cpu-*-inside_the_region]", "*::test_known_issue_status_matches_the_registry*")
    assert len([t for t in run.failed if UPDATED in t]) == 4
    run.stdout.fnmatch_lines(["*optimizer_step inside the region, torch.bfloat16: largest difference*cached before*"],
                             consecutive=False)  # fmt: skip


def test_regions_that_keep_their_casts_on_exit_fail_the_update_between_regions(pytester, suite_copy):
    """A release whose regions no longer drop their casts on exit: the documented loop, the update
    between two regions, computes with the weights before it and fails, for both updates and dtypes."""
    suite_copy("autocast/test_in_place_updates.py", conftest=False)
    inject(pytester, "autocast", patches={"torch.clear_autocast_cache": "faults.autocast.region_exit_keeps_casts"})
    run = run_inner(pytester)
    assert_caught(run, f"*::{UPDATED}[[]cpu-*-between_regions]")
    assert len(run.failed) == 4


def test_a_kernel_making_nan_rows_at_masked_key_blocks_fails_the_mask_cells_and_the_registry(pytester, suite_copy):
    """Real history, replayed on a release without it: torch 2.4.0's CPU flash kernel made NaN rows
    where a block of queries met a whole block of masked keys. Both masks fail in both dtypes,
    naming the rows, and the registry check reads the issue outside its range (2.4.0 only)."""
    suite_copy("autocast/test_attention_masks.py", conftest=False)
    patches = {
        "torch.nn.functional.scaled_dot_product_attention": "faults.autocast.attention_nan_for_masked_key_blocks"
    }
    inject(pytester, "autocast", patches=patches)
    run = run_inner(pytester)
    assert_caught(
        run,
        "*::test_attention_with_a_mask_that_leaves_each_query_some_keys_is_finite[[]cpu-*]",
        "*::test_known_issue_status_matches_the_registry*",
    )
    assert len(run.failed) == 5
    run.stdout.fnmatch_lines(["*left_padding mask over 640 positions: * rows non-finite under*"], consecutive=False)


ATTENTION = "test_an_inf_or_nan_in_attention_makes_the_outputs_float64_makes_non_finite_non_finite"


def test_an_attention_kernel_that_zeroes_non_finite_outputs_fails_every_attention_cell(pytester, suite_copy):
    """A kernel hiding every overflow: each cell fails, naming how many outputs came out finite (the
    issue cells too: it hides at lengths the registered issues do not), and the registry checks
    fail, the issues no longer showing in their own shape."""
    suite_copy("autocast/test_attention_nonfinite.py", conftest=False)
    inject(
        pytester,
        "autocast",
        patches={"torch.nn.functional.scaled_dot_product_attention": "faults.autocast.attention_zeroing_non_finite"},
    )
    run = run_inner(pytester)
    cells = [f"*::{ATTENTION}[[]cpu-*-{t}-{v}]" for t in ("query", "key", "value") for v in ("inf", "nan")]
    assert_caught(run, *cells, "*::test_known_issue_status_matches_the_registry*")
    assert len(run.failed) == 14, sorted(run.failed)  # 3 tensors x 2 values x 2 dtypes, 2 registry checks
    run.stdout.fnmatch_lines(
        ["*inf in the value: length 5: 5 of 5 non-finite outputs came out finite*"], consecutive=False
    )


def test_the_attention_issues_fail_their_cells_without_their_registry_entries(pytester, suite_copy):
    """Real history: on a release with both attention issues (2.9 to 2.15 on the CPU), the cells they
    fail are judged once the registry no longer lists them, and the registry checks read them as
    regressions; the value cells pass."""
    from harness.domains.autocast import nonfinite

    present = [
        nonfinite.issue_present(i, torch.device("cpu"))[0]
        for i in sorted({i for i, _ in nonfinite.ISSUE_CELLS.values()})
    ]
    if not all(present):
        pytest.skip(f"torch {torch.__version__} propagates some of the attention cases: nothing to catch for both")
    suite_copy("autocast/test_attention_nonfinite.py", conftest=False)
    inject(
        pytester,
        "autocast",
        patches={
            "harness.domains.autocast.known_issues.KNOWN_ISSUES": "faults.autocast.attention_issues_fixed_in_this_release"
        },
    )
    run = run_inner(pytester)
    assert_caught(
        run,
        f"*::{ATTENTION}[[]cpu-*-query-inf]",
        f"*::{ATTENTION}[[]cpu-*-key-inf]",
        f"*::{ATTENTION}[[]cpu-*-query-nan]",
        "*::test_known_issue_status_matches_the_registry*",
    )
    assert not [t for t in run.failed if "value" in t]
