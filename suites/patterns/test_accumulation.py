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
from harness.domains.patterns.repro import accumulation_repro, no_sync_repro

pytestmark = pytest.mark.amp_capability("loss scaling")


def test_the_accumulated_gradient_is_the_float64_sum_of_the_micro_batches(amp_device, amp_dtype, amp_record):
    run = A.effective_batch(amp_device, amp_dtype)
    claims = A.sum_claims(run)
    amp_record.require(
        claims.scale, dtype=amp_dtype, device=amp_device, repro=accumulation_repro(amp_device, amp_dtype)
    )
    amp_record.require(
        claims.total,
        dtype=amp_dtype,
        device=amp_device,
        tags={"worst_error_over_budget": claims.worst, "micro_batches": A.MICRO_BATCHES},
        repro=accumulation_repro(amp_device, amp_dtype),
    )


@pytest.mark.parametrize("inf_in", range(A.MICRO_BATCHES), ids=lambda i: f"micro_batch_{i}")
def test_an_inf_in_any_micro_batch_skips_the_effective_batch_and_backs_off_once(inf_in, amp_device, amp_record):
    run = A.effective_batch(amp_device, torch.float16, inf_in=inf_in)  # the dtype GradScaler is for
    amp_record.require(
        A.overflow_claim(run, inf_in),
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
            rank_programs.ddp_no_sync_accumulation,
            world=2,
            micro_batches=A.MICRO_BATCHES,
            cases=NO_SYNC_CASES,
            sync=rank_programs.NO_SYNC,
        )
    return _LAUNCHED[rank_programs.NO_SYNC]


def rank_programs_default() -> bool:
    """The accumulation context is torch's no_sync (a swapped one, a negative control's, has no
    script: the script runs the documented loop)."""
    from harness.domains.patterns import rank_programs

    return f"{rank_programs.__name__}:no_sync_but_last" == rank_programs.NO_SYNC


@pytest.mark.amp_capability("distributed")
def test_under_no_sync_the_synchronised_gradient_is_the_float64_average_of_the_ranks_sums(amp_record):
    runs = no_sync_runs()
    world, clean = len(runs), [r[0] for r in runs]
    amp_record.require(
        A.no_sync_claim(clean),
        repro=no_sync_repro(str(clean[0]["device"]), None) if rank_programs_default() else None,
        device=clean[0]["device"],
        tags={"world": world, "micro_batches": A.MICRO_BATCHES},
    )


@pytest.mark.amp_capability("distributed")
@pytest.mark.parametrize(
    "case", [1, 2], ids=lambda i: f"inf_on_rank_{NO_SYNC_CASES[i][0]}_micro_batch_{NO_SYNC_CASES[i][1]}"
)
def test_under_no_sync_an_inf_on_one_rank_skips_the_step_on_every_rank(case, amp_record):
    seen = [r[case] for r in no_sync_runs()]
    amp_record.require(
        A.no_sync_overflow_claim(seen, NO_SYNC_CASES[case]),
        repro=no_sync_repro(str(seen[0]["device"]), NO_SYNC_CASES[case]) if rank_programs_default() else None,
        device=seen[0]["device"],
        tags={"case": NO_SYNC_CASES[case]},
    )
