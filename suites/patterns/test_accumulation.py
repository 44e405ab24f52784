"""Gradient accumulation under GradScaler adds the micro-batches' gradients under one scale, and
an overflow in any micro-batch skips the effective batch.

The AMP examples' pattern: each micro-batch's loss divided by the number of micro-batches, a scaled
backward for every one, ``step``/``update`` only at the effective batch's end. The scale must stay
the same for every micro-batch; the accumulated gradient (after ``unscale_``) must be the float64
sum of the micro-batches' own gradients within gamma_(k-1)(2^-24) of their magnitudes; an inf in any
one micro-batch must skip the step (parameters and optimizer state untouched) and halve the scale once."""

from __future__ import annotations

import pytest
import torch

from harness.domains.patterns import accumulation as A
from harness.domains.patterns.repro import accumulation_repro
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("loss scaling")


def test_the_accumulated_gradient_is_the_float64_sum_of_the_micro_batches(amp_device, amp_dtype, amp_record):
    run = A.effective_batch(amp_device, amp_dtype)
    changed = [s for s in run.scales if s != run.scale_start]
    over = (run.accumulated.double() - run.reference).abs() > run.budget
    worst = float(((run.accumulated.double() - run.reference).abs() / run.budget.clamp_min(1e-300)).max())
    amp_record.require(
        compare_claim(
            "accumulation.scale_changes_inside_the_effective_batch",
            len(changed),
            not changed,
            "the scale stays the same for every micro-batch of an effective batch (update only at its end)",
            detail=f"scales after each micro-batch: {list(run.scales)}, the effective batch started at {run.scale_start}",
            expected=0,
            allowance=0,
            unit="micro-batches",
        ),
        dtype=amp_dtype,
        device=amp_device,
        repro=accumulation_repro(amp_device, amp_dtype),
    )
    amp_record.require(
        compare_claim(
            "accumulation.elements_over_budget",
            int(over.sum()),
            not bool(over.any()),
            "|accumulated gradient - float64 sum of the micro-batches' own gradients| <= gamma_(k-1)(2^-24) x the "
            "sum of their magnitudes (k micro-batches accumulated in fp32, Higham 4.2)",
            detail=f"{int(over.sum())} of {over.numel()} gradient elements over their budget (worst {worst:.3g}x): the "
            "micro-batches' gradients were not summed under one scale",
            expected=0,
            allowance=0,
            unit="elements",
        ),
        dtype=amp_dtype,
        device=amp_device,
        tags={"worst_error_over_budget": worst, "micro_batches": A.MICRO_BATCHES},
        repro=accumulation_repro(amp_device, amp_dtype),
    )


@pytest.mark.parametrize("inf_in", range(A.MICRO_BATCHES), ids=lambda i: f"micro_batch_{i}")
def test_an_inf_in_any_micro_batch_skips_the_effective_batch_and_backs_off_once(inf_in, amp_device, amp_record):
    run = A.effective_batch(amp_device, torch.float16, inf_in=inf_in)  # the dtype GradScaler is for
    problems = []
    if run.stepped or not run.untouched:
        problems.append("the step changed parameters or optimizer state")
    if run.scale_after_update != run.scale_start * 0.5:
        problems.append(f"scale {run.scale_start} -> {run.scale_after_update}, expected x0.5")
    amp_record.require(
        compare_claim(
            "accumulation.overflow_problems",
            len(problems),
            not problems,
            "an inf in one micro-batch skips the effective batch's step (parameters and optimizer state bitwise "
            "untouched) and halves the scale once",
            detail=f"inf in micro-batch {inf_in}: " + "; ".join(problems),
            expected=0,
            allowance=0,
            unit="problems",
        ),
        device=amp_device,
        tags={"inf_in": inf_in, "scale": [run.scale_start, run.scale_after_update]},
        repro=accumulation_repro(amp_device, torch.float16, inf_in),
    )


# -- under DDP: no_sync() on every micro-batch but the last ---------------------------------------
#: the effective batches of the DDP run: clean, an inf in rank 1's first micro-batch (under
#: no_sync: only rank 1 sees it before the all-reduce), an inf in rank 0's last micro-batch
NO_SYNC_CASES = [None, [1, 0], [0, A.MICRO_BATCHES - 1]]


_LAUNCHED: dict[str, list] = {}


def no_sync_runs():
    """Two ranks (gloo on the CPU, NCCL where there are two GPUs) accumulating under DDP's
    no_sync(), every case in one launch per module: per rank, per case, what
    :func:`rank_programs.ddp_no_sync_accumulation` observed. Launched from the test body, so that the
    accumulation context (``rank_programs.NO_SYNC``, which the negative controls swap) is read there."""
    from harness.domains.engines.ranks import ranks
    from harness.domains.patterns import rank_programs

    if rank_programs.NO_SYNC not in _LAUNCHED:
        _LAUNCHED[rank_programs.NO_SYNC] = ranks.launch(
            "harness.domains.patterns.rank_programs:ddp_no_sync_accumulation",
            world=2,
            micro_batches=A.MICRO_BATCHES,
            cases=NO_SYNC_CASES,
            sync=rank_programs.NO_SYNC,
        )
    return _LAUNCHED[rank_programs.NO_SYNC]


@pytest.mark.amp_capability("distributed")
def test_under_no_sync_the_synchronised_gradient_is_the_float64_average_of_the_ranks_sums(amp_record):
    import math

    from harness.numerics.formats import FP32
    from harness.numerics.tolerance import gamma

    runs = no_sync_runs()
    world, clean = len(runs), [r[0] for r in runs]
    reference = torch.tensor([c["own_sum"] for c in clean]).mean(0)
    magnitude = torch.tensor([c["own_abs_sum"] for c in clean]).mean(0)
    # k - 1 additions accumulating on each rank, world - 1 in the all-reduce; dividing by world is exact
    budget = gamma(A.MICRO_BATCHES + world - 2, FP32.unit_roundoff) * magnitude
    problems = [f"rank {r}: scales {c['scales']}" for r, c in enumerate(clean) if len(set(c["scales"])) != 1]
    grads = [torch.tensor(c["grads"]) for c in clean]
    problems += [
        f"rank {r}'s gradients differ from rank 0's" for r in range(1, world) if not torch.equal(grads[r], grads[0])
    ]
    over = int(((grads[0] - reference).abs() > budget).sum())
    if over:
        worst = float(((grads[0] - reference).abs() / budget.clamp_min(math.ulp(0.0))).max())
        problems.append(f"{over} of {reference.numel()} gradient elements over budget (worst {worst:.3g}x)")
    amp_record.require(
        compare_claim(
            "accumulation.no_sync.problems",
            len(problems),
            not problems,
            "under no_sync() on all but the last micro-batch: one scale per effective batch on every rank, the same "
            "synchronised gradient on every rank, within gamma_(k+world-2)(2^-24) of the float64 average of the "
            "ranks' sums of their micro-batches' own gradients",
            detail="; ".join(problems),
            expected=0,
            allowance=0,
            unit="problems",
        ),
        device=clean[0]["device"],
        tags={"world": world, "micro_batches": A.MICRO_BATCHES},
    )


@pytest.mark.amp_capability("distributed")
@pytest.mark.parametrize(
    "case", [1, 2], ids=lambda i: f"inf_on_rank_{NO_SYNC_CASES[i][0]}_micro_batch_{NO_SYNC_CASES[i][1]}"
)
def test_under_no_sync_an_inf_on_one_rank_skips_the_step_on_every_rank(case, amp_record):
    seen = [r[case] for r in no_sync_runs()]
    problems = [f"rank {r} stepped" for r, s in enumerate(seen) if s["stepped"] or s["momentum"]]
    problems += [
        f"rank {r}: scale {s['scales'][0]} -> {s['scale_after']}, expected x0.5"
        for r, s in enumerate(seen)
        if s["scale_after"] != s["scales"][0] * 0.5
    ]
    amp_record.require(
        compare_claim(
            "accumulation.no_sync.overflow_problems",
            len(problems),
            not problems,
            "an inf in one rank's micro-batch (inside no_sync or in the synchronised one) skips the step on every "
            "rank (parameters and momentum untouched) and halves every rank's scale once",
            detail=f"inf on rank {NO_SYNC_CASES[case][0]}, micro-batch {NO_SYNC_CASES[case][1]}: "
            + "; ".join(problems),
            expected=0,
            allowance=0,
            unit="problems",
        ),
        device=seen[0]["device"],
        tags={"case": NO_SYNC_CASES[case]},
    )
