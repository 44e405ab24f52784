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
    )
