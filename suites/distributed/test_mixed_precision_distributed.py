"""Claim family: mixed precision stays correct when training is data-parallel and sharded.

Real torch.distributed ranks (gloo on the CPU, NCCL with 2+ GPUs), launched from the test with a
timeout: DDP's fp16 gradient compression against plain fp32 all-reduce within a budget derived from
the format and the world size; DDP + autocast + GradScaler against the same training in one
process; FSDP2 (``fully_shard``) with bf16 parameters and fp32 or bf16 reduction against the
single-process computation, each reduce within its declared dtype's budget, where the fp32 reduce
must meet the fp32 budget and the bf16 reduce must not; every field of FSDP2's mixed-precision
policy and every DDP hook's declared dtype against what the collectives and modules were observed
to carry (``harness/domains/distributed/policy.py``); an inf in one rank's gradient shard makes
every rank skip with the same scale.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.distributed import checks, policy, programs
from harness.domains.distributed.repro import distributed as distributed_repro
from harness.domains.engines.ranks import ranks as dist_h
from harness.numerics import budgets
from harness.numerics.comparison import ElementwiseComparison, compare_within, explain
from harness.numerics.formats import BF16, FP16, torch_dtype

pytestmark = pytest.mark.amp_capability("distributed")

#: the ranks the suite spawns without a launcher; under one, the launched world's size (each
#: budget is derived from the world the results came from: ``len(results)``)
WORLD = 2
#: the suite's default sharded scaler is torch's, reached through the harness's rank module
_HARNESS_SHARDED_SCALER = "harness.domains.distributed.programs:sharded_grad_scaler"
_TORCH_SHARDED_SCALER = "torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler"


def _nccl() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= WORLD


@pytest.mark.parametrize("fmt_name", ["fp16", "bf16"])
def test_ddp_compressed_gradients_stay_within_the_format_budget_of_plain_allreduce(fmt_name, ddp_hook, amp_record):
    if fmt_name == "bf16" and not _nccl():
        pytest.skip("bf16 compression is missing: torch's bf16_compress_hook refuses gloo (it needs NCCL: 2+ GPUs)")
    results = dist_h.launch(programs.ddp_gradients, world=WORLD, hook=ddp_hook[fmt_name])
    fmt = FP16 if fmt_name == "fp16" else BF16
    _require_declared(amp_record, f"ddp.{fmt_name}_compression", results, "hooked_observed", torch_dtype(fmt))
    repro = _repro(
        f"DDP {fmt_name} compression hook against DDP's plain all-reduce: the worst element over its budget",
        "ddp_compression",
        {"HOOK": ddp_hook[fmt_name], "PLAIN_HOOK": None},
        str(torch_dtype(fmt)).removeprefix("torch."),
    )
    for tensor_i in range(len(results[0]["plain"])):
        budget = budgets.ddp_compression(torch.tensor([r["local"][tensor_i] for r in results]), fmt, len(results))
        for rank, r in enumerate(results):
            result = compare_within(
                f"DDP {fmt_name} compression, tensor {tensor_i}, rank {rank}",
                torch.tensor(r["hooked"][tensor_i]),
                torch.tensor(r["plain"][tensor_i]),
                budget.bound,
                budget.origin,
                what="|compressed - plain all-reduce|",
            )
            amp_record.require(result, dtype=fmt.name, tags={"world": len(results), "rank": rank}, repro=repro)


def test_ddp_fp32_allreduce_averages_gradients_within_the_fp32_budget_of_one_process(ddp_plain_hook, amp_record):
    """DDP's averaged gradients against the single-process computation (each rank's local
    gradient, averaged exactly in float64), within the fp32 reduce budget, as FSDP2's reduce is held:
    a precision loss anywhere in DDP's communication path fails here, where the compression checks
    above only compare DDP with DDP."""
    results = dist_h.launch(
        programs.ddp_gradients,
        world=WORLD,
        hook=f"{programs.DEFAULT_HOOKS}:allreduce_hook",
        plain_hook=ddp_plain_hook,
    )
    _require_declared(amp_record, "ddp.allreduce_hook", results, "hooked_observed", torch.float32)
    repro = _repro(
        "DDP's averaged gradients against the exact mean of the ranks' own: the worst element over its budget",
        "ddp_allreduce",
        {"HOOK": f"{programs.DEFAULT_HOOKS}:allreduce_hook", "PLAIN_HOOK": ddp_plain_hook},
    )
    for tensor_i in range(len(results[0]["plain"])):
        locals_ = torch.tensor([r["local"][tensor_i] for r in results], dtype=torch.float64)
        budget = budgets.fp32_reduce(locals_, len(results))
        for rank, r in enumerate(results):
            result = compare_within(
                f"DDP fp32 all-reduce, tensor {tensor_i}, rank {rank}",
                torch.tensor(r["plain"][tensor_i]),
                locals_.mean(0),
                budget.bound,
                budget.origin,
                what="|DDP averaged gradient - exact mean of the ranks' local gradients|",
            )
            amp_record.require(result, dtype="float32", tags={"world": len(results), "rank": rank}, repro=repro)


def test_ddp_autocast_gradscaler_training_matches_one_process(ddp_amp_hook, amp_record):
    """The ranks see the same samples as the single process; what differs is where the batch is
    reduced (per half-batch, then across ranks). The first step's gradients (same weights) are
    held to that reordering's rounding budget, which a gradient off by any real fraction leaves;
    the losses of every step, to the compounded budget (loose: it bounds six steps of drift)."""
    steps = 6
    ranks = dist_h.launch(programs.ddp_amp_training, world=WORLD, steps=steps, hook=ddp_amp_hook)
    single = programs.single_process_amp_training(steps)
    grad_budget = budgets.reordered_batch_gradient(
        torch.cat(programs.per_sample_gradient_magnitudes(0)), programs.GLOBAL_BATCH, programs.MODEL_MODULES, FP16
    )
    loss_budget = budgets.reordered_batch_losses(torch.tensor(single["losses"]), programs.GLOBAL_BATCH, FP16)
    repro = _repro(
        f"DDP(world={WORLD}) + fp16 autocast + GradScaler against one process: the worst element over its budget",
        "ddp_amp_training",
        {"HOOK": ddp_amp_hook},
    )
    for rank, r in enumerate(ranks):
        first = compare_within(
            f"DDP(world={WORLD}) vs one process, first step's gradients, rank {rank}",
            torch.tensor([v for g in r["first_grads"] for v in g], dtype=torch.float64),
            torch.tensor([v for g in single["first_grads"] for v in g], dtype=torch.float64),
            grad_budget.bound,
            grad_budget.origin,
            what="|DDP gradient - one process's|",
        )
        amp_record.require(first, dtype="float16", tags={"world": WORLD, "rank": rank}, repro=repro)
        result = compare_within(
            f"DDP(world={WORLD}) vs one process, rank {rank}",
            torch.tensor(r["losses"]),
            torch.tensor(single["losses"]),
            loss_budget.bound,
            loss_budget.origin,
            what="|DDP - one process|",
        )
        amp_record.require(result, dtype="float16", tags={"world": WORLD, "rank": rank}, repro=repro)


#: FSDP2 runs by (sharding function, reduce dtype): both FSDP2 checks read the same two launches
#: (starting ranks is this suite's cost).
_FSDP2_RUNS: dict[tuple[str, str], list] = {}
REDUCE_DTYPES = ("float32", "bfloat16")


def _fsdp2(shard: str) -> dict[str, list]:
    for rd in REDUCE_DTYPES:
        if (shard, rd) not in _FSDP2_RUNS:
            _FSDP2_RUNS[(shard, rd)] = dist_h.launch(
                programs.fsdp2_gradients, world=WORLD, reduce_dtype=rd, shard=shard
            )
    return {rd: _FSDP2_RUNS[(shard, rd)] for rd in REDUCE_DTYPES}


def _repro(what: str, check: str, specs: dict[str, str | None], fmt_name: str | None = None):
    """The check as a script whose ranks fork from it (gloo: on NCCL runs, none): the suite's
    model, inputs and rank program written out, the implementations under test by name."""
    return None if _nccl() else distributed_repro(what, check, WORLD, specs, fmt_name)


def _require_declared(amp_record, prefix, results, key, declared: torch.dtype) -> None:
    """A DDP run's all-reduce dtype against the one its hook declares (every rank)."""
    name = str(declared).removeprefix("torch.")
    findings = [policy.compare_hook(policy.Observed.from_dict(r[key]), name) for r in results]
    amp_record.require(
        policy.hook_claim(prefix, findings, name),
        dtype=name,
        tags={"declared": name, "observed": sorted({d for f in findings for d in f.observed})},
    )


def test_fsdp2_does_what_its_mixed_precision_policy_declares(fsdp2_shard, amp_record):
    """param_dtype (modules and all-gather), reduce_dtype (reduce-scatter), output_dtype and
    cast_forward_inputs, each observed on every rank against the declared policy: one row per field
    and reduce dtype; a mismatch names the field, the module or collective call, and what it carried."""
    missed = []
    for rd, results in _fsdp2(fsdp2_shard).items():
        findings = [policy.compare_fsdp2(policy.Observed.from_dict(r["observed"]), **r["declared"]) for r in results]
        for per_rank in zip(*findings, strict=True):
            f = per_rank[0]
            claim = policy.fsdp2_field_claim(rd, per_rank)
            observed = sorted({d for g in per_rank for d in g.observed})
            repro = None if claim.passed else _policy_repro(fsdp2_shard, f.field, rd)
            tags = {"declared": f.declared, "observed": observed}
            if not amp_record.result(claim, dtype="bfloat16", tags=tags, repro=repro):
                missed.append(claim)
    assert not missed, "\n".join(explain(c) for c in missed)  # verdict recorded


def _policy_repro(shard: str, field: str, reduce_dtype: str):
    """One FSDP2 policy field's check as a script (gloo: on NCCL runs, none)."""
    if _nccl():
        return None
    return distributed_repro(
        f"FSDP2 MixedPrecisionPolicy {field} (reduce dtype {reduce_dtype}): module and collective calls carrying "
        "another dtype",
        "fsdp2_policy",
        WORLD,
        {"SHARD": shard},
        reduce_dtype,
        {"FIELD": field},
    )


def _against_exact_mean(
    name: str, averaged: torch.Tensor, locals_: torch.Tensor, budget: budgets.Budget
) -> ElementwiseComparison:
    """FSDP2's reduced gradient against the single-process computation: the ranks' local
    gradients averaged exactly."""
    return compare_within(
        name, averaged, locals_.mean(0), budget.bound, budget.origin, what="|FSDP2 reduce - exact mean|"
    )


def test_fsdp2_fp32_reduce_meets_the_fp32_budget_and_bf16_reduce_does_not(fsdp2_shard, amp_record):
    """Each reduce is held to the single-process computation (the ranks' local bf16 gradients,
    averaged exactly) within its declared dtype's budget; the fp32 reduce must also be measurably
    closer than the bf16 one (the bf16 reduce misses the fp32 budget)."""
    worst, missed = {}, []
    for rd, results in _fsdp2(fsdp2_shard).items():
        repro = _repro(
            f"FSDP2's {rd} reduce against the exact mean of the ranks' own gradients: the worst element over its "
            "budget",
            "fsdp2_reduce",
            {"SHARD": fsdp2_shard},
            rd,
        )
        ratios = []
        for tensor_i in range(len(results[0]["averaged"])):
            locals_ = torch.tensor([r["local"][tensor_i] for r in results], dtype=torch.float64)
            averaged = torch.tensor(results[0]["averaged"][tensor_i])
            fp32 = budgets.fp32_reduce(locals_, len(results))
            result = _against_exact_mean(f"FSDP2 reduce {rd}, tensor {tensor_i}", averaged, locals_, fp32)
            ratios.append(result.max_abs_diff or 0.0)
            if rd != "float32":  # held to its own dtype's budget; the fp32 budget is the comparison below
                own = budgets.low_precision_reduce(locals_, BF16, len(results))
                name = f"FSDP2 reduce {rd} within its own budget, tensor {tensor_i}"
                result = _against_exact_mean(name, averaged, locals_, own)
            keep = None if result.passed else repro  # the first failed tensor keeps the script (one per reduce)
            if not amp_record.result(result, dtype="bfloat16", tags={"reduce_dtype": rd}, repro=keep):
                missed.append(result)
                repro = None
        worst[rd] = max(ratios)
        amp_record(f"fsdp2.reduce_{rd}.worst_error_over_fp32_budget", worst[rd], allowance=1.0, dtype="bfloat16")
    closer = checks.reduce_closer_claim(worst)
    if not amp_record.result(closer, dtype="bfloat16"):
        missed.append(closer)
    assert not missed, "\n".join(explain(c) for c in missed)  # verdict recorded


def test_an_inf_on_any_one_rank_makes_every_rank_skip_with_the_same_scale(sharded_scaler, amp_record):
    """Each rank in turn holds the only inf (one launch: starting ranks is this suite's cost)."""
    per_rank = dist_h.launch(
        programs.sharded_scaler_step,
        world=WORLD,
        scaler=sharded_scaler,
        inf_ranks=list(range(WORLD)),
    )
    missed = []
    for case, inf_rank in enumerate(range(WORLD)):
        seen = [r[case] for r in per_rank]
        claims = checks.sharded_scaler_claims(seen, inf_rank)
        scales = [s["scale"] for s in seen]
        repro = _repro(
            "an inf on one rank of sharded training: cases where a rank stepped or the ranks' scales differ",
            "sharded_scaler",
            {"SCALER": _TORCH_SHARDED_SCALER if sharded_scaler == _HARNESS_SHARDED_SCALER else sharded_scaler},
        )
        for c in claims:  # the first failed claim keeps the script (it runs every case)
            if not amp_record.result(c, tags={"inf_rank": inf_rank, "scales": scales}, repro=None if missed else repro):
                missed.append(c)
    assert not missed, "\n".join(explain(c) for c in missed)  # verdict recorded
