"""Negative controls for the distributed suite, and the launcher's robustness."""

from __future__ import annotations

import time

import pytest
from helpers import assert_caught, inject, run_inner

from harness.domains.distributed import ranks as dist_h

SUITE = "distributed/test_mixed_precision_distributed.py"


def _override(pytester, fixture: str, value: object) -> None:
    inject(pytester, "distributed", fixtures={fixture: repr(value)})


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("compress_hook_without_division", "*DDP fp16 compression, tensor *: FAILED: mismatched elements*"),
        ("compress_hook_losing_mantissa", "*DDP fp16 compression, tensor *: FAILED: mismatched elements*"),
    ],
)
def test_a_broken_compression_hook_fails(pytester, suite_copy, hook, message):
    suite_copy(SUITE, conftest=False)
    _override(pytester, "ddp_hook", {"fp16": f"faults.distributed:{hook}", "bf16": f"faults.distributed:{hook}"})
    run = run_inner(pytester, "-k", "compressed and fp16")
    assert_caught(run, "*::test_ddp_compressed_gradients_stay_within_the_format_budget_of_plain_allreduce[[]fp16]")
    run.stdout.fnmatch_lines([message], consecutive=False)


def test_a_lossy_ddp_communication_path_fails_the_single_process_fp32_reference(pytester, suite_copy):
    """DDP's "plain" all-reduce replaced by one that rounds through bf16: the check that holds DDP's
    averaged gradients to the single-process fp32 computation fails (the compression checks, which
    compare DDP with DDP, could not see it)."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "ddp_plain_hook", "faults.distributed:compress_hook_losing_mantissa")
    run = run_inner(pytester, "-k", "fp32_allreduce")
    assert_caught(run, "*::test_ddp_fp32_allreduce_averages_gradients_within_the_fp32_budget_of_one_process")
    run.stdout.fnmatch_lines(["*DDP fp32 all-reduce, tensor *: FAILED: mismatched elements*"], consecutive=False)


def test_a_hook_that_does_not_send_its_declared_dtype_fails_the_declared_vs_observed_row(pytester, suite_copy):
    """A "compression" hook that sends fp32: its gradients are exact, so only the row that holds
    the all-reduce's dtype to the declared fp16 can see it."""
    suite_copy(SUITE, conftest=False)
    hook = "faults.distributed:uncompressed_hook"
    _override(pytester, "ddp_hook", {"fp16": hook, "bf16": hook})
    run = run_inner(pytester, "-k", "compressed and fp16")
    assert_caught(run, "*::test_ddp_compressed_gradients_stay_within_the_format_budget_of_plain_allreduce[[]fp16]")
    run.stdout.fnmatch_lines(
        ["*ddp.fp16_compression.declared_vs_observed.all_reduce: FAILED*", "*rank 0: all_reduce call 0: float32*"],
        consecutive=False,
    )
    failed = [r for r in run.rows if r["outcome"] == "fail"]
    assert [r["metric"] for r in failed] == ["ddp.fp16_compression.declared_vs_observed.all_reduce"], failed


FSDP2_POLICY = "*::test_fsdp2_does_what_its_mixed_precision_policy_declares"
FSDP2_REDUCE = "*::test_fsdp2_fp32_reduce_meets_the_fp32_budget_and_bf16_reduce_does_not"


@pytest.mark.parametrize(
    ("fault", "caught", "message"),
    [
        (
            "fully_shard_ignoring_reduce_dtype",
            (FSDP2_POLICY, FSDP2_REDUCE),
            "*fsdp2.reduce_float32.declared_vs_observed.reduce_dtype.reduce_scatter: FAILED*",
        ),
        (
            "fully_shard_ignoring_output_dtype",
            (FSDP2_POLICY,),
            "*fsdp2.reduce_float32.declared_vs_observed.output_dtype: FAILED*",
        ),
    ],
)
def test_an_ignored_fsdp2_policy_field_fails_naming_it(pytester, suite_copy, fault, caught, message):
    """FSDP2 dropping one declared field: the declared-vs-observed check names the field, the rank
    and what was carried; a dropped reduce dtype also fails the reduce's fp32 budget."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "fsdp2_shard", f"faults.distributed:{fault}")
    run = run_inner(pytester, "-k", "fsdp2")
    assert_caught(run, *caught)
    run.stdout.fnmatch_lines([message, "*rank 0: *bfloat16*"], consecutive=False)


def test_a_lossy_reduce_that_carries_the_declared_dtype_fails_the_reduce_budgets(pytester, suite_copy):
    """A reduce-scatter that rounds through fp8 while carrying the declared dtypes: the policy rows
    pass (nothing was mislabelled) and both reduces miss their own dtype's budget."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "fsdp2_shard", "faults.distributed:fully_shard_with_lossy_reduce_scatter")
    run = run_inner(pytester, "-k", "fsdp2")
    assert_caught(run, FSDP2_REDUCE)
    run.stdout.fnmatch_lines(["*FSDP2 reduce float32, tensor *: FAILED*"], consecutive=False)
    failed = {r["metric"].split(",")[0] for r in run.rows if r["outcome"] == "fail"}
    assert failed == {
        "FSDP2 reduce float32",
        "FSDP2 reduce bfloat16 within its own budget",
        "fsdp2.bf16_reduce_exceeds_the_fp32_budget",
    }, failed


def test_a_sharded_scaler_that_does_not_share_its_inf_flag_fails(pytester, suite_copy):
    suite_copy(SUITE, conftest=False)
    _override(pytester, "sharded_scaler", "faults.distributed:LocalInfScaler")
    run = run_inner(pytester, "-k", "every_rank_skip")
    assert_caught(run, "*::test_an_inf_on_any_one_rank_makes_every_rank_skip_with_the_same_scale")
    run.stdout.fnmatch_lines(
        ["*inf only on rank 0: ranks [[]1[]] stepped anyway*", "*inf only on rank 1: ranks [[]0[]] stepped anyway*"],
        consecutive=False,
    )


def test_a_crashing_rank_surfaces_its_traceback():
    with pytest.raises(dist_h.RankError, match=r"(?s)rank 1 failed:\n.*ValueError: rank 1 broke on purpose"):
        dist_h.launch("faults.distributed:rank_crashes", world=2, timeout_s=60)


def test_a_hung_rank_is_killed_at_the_timeout():
    start = time.monotonic()
    # rank 0 returns at once; on a first launch it may still be starting when the timeout hits
    with pytest.raises(dist_h.RankError, match=r"rank\(s\) \[(0, )?1\] did not finish within 1 s"):
        dist_h.launch("faults.distributed:rank_hangs", world=2, timeout_s=1)
    assert time.monotonic() - start < 30
