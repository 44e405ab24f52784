"""A gradient penalty under GradScaler is the penalty of the unscaled gradients, and its step is the
unscaled step's.

The AMP examples' pattern: gradients of the scaled loss with ``create_graph=True``, unscaled by hand
with ``1 / scaler.get_scale()``, their norm computed under autocast and added to the loss, then the
usual scaled backward. The penalty must be the float64 norm of those unscaled gradients within
gamma_(n+1)(2^-24); the parameters' gradients must be bit for bit those of the same step without
loss scaling (scaling by a power of two is exact); an inf in the penalty's gradients must skip the
step (parameters and optimizer state untouched) and back the scale off once."""

from __future__ import annotations

import pytest
import torch

from harness.domains.patterns import penalty as P
from harness.domains.patterns import repeated
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("loss scaling")


def test_the_penalty_is_the_float64_norm_of_the_unscaled_gradients(amp_device, amp_dtype, amp_record):
    step = P.penalised_step(amp_device, amp_dtype)
    error = abs(step.penalty - step.penalty_float64)
    amp_record.require(
        compare_claim(
            "gradient_penalty.penalty_error",
            error,
            error <= step.penalty_budget,
            "|penalty - float64 norm of the same unscaled gradients| <= gamma_(n+1)(2^-24) x that norm (the "
            "penalty sums n squares in fp32, Higham 3.1)",
            detail=f"penalty {step.penalty!r} against float64 {step.penalty_float64!r}: error {error:.3g} over the "
            f"budget {step.penalty_budget:.3g}: the penalty was not computed in fp32 from the unscaled gradients",
            expected=step.penalty_float64,
            allowance=step.penalty_budget,
        ),
        dtype=amp_dtype,
        device=amp_device,
    )


def _grads_differing(a: P.PenaltyStep, b: P.PenaltyStep) -> list[str]:
    n = int((a.grads != b.grads).sum())
    return [f"{n} gradient elements"] if n else []


def test_the_penalised_step_equals_the_step_without_loss_scaling_bit_for_bit(amp_device, amp_dtype, amp_record):
    plain, unstable = repeated(lambda: P.penalised_step(amp_device, amp_dtype, scale=None), _grads_differing)
    amp_record.require_repeatable(
        "gradient_penalty.reference_unrepeatable", unstable, device=amp_device, dtype=amp_dtype
    )
    scaled = P.penalised_step(amp_device, amp_dtype)
    differ = int((scaled.grads != plain.grads).sum())
    worst = float((scaled.grads - plain.grads).abs().max())
    amp_record.require(
        compare_claim(
            "gradient_penalty.grads_differing_from_the_unscaled_step",
            differ,
            differ == 0,
            "the parameters' gradients after unscale_ equal, bit for bit, those of the same penalised step with no "
            "GradScaler (scaling by a power of two and unscaling by hand are exact)",
            detail=f"{differ} of {plain.grads.numel()} gradient elements differ from the unscaled step's (largest "
            f"difference {worst:.3g}): the penalty's gradients were not unscaled as the loss's were",
            expected=0,
            allowance=0,
            unit="elements",
        ),
        dtype=amp_dtype,
        device=amp_device,
    )


def test_an_inf_in_the_penalty_gradients_skips_the_step_and_backs_off_once(amp_device, amp_record):
    step = P.penalised_step(amp_device, torch.float16, inf_in_penalty_grads=True)  # the dtype GradScaler is for
    problems = []
    if step.stepped or not step.untouched:
        problems.append("the step changed parameters or optimizer state")
    if step.scale_after != step.scale_before * 0.5:
        problems.append(f"scale {step.scale_before} -> {step.scale_after}, expected x0.5")
    amp_record.require(
        compare_claim(
            "gradient_penalty.overflow_problems",
            len(problems),
            not problems,
            "an inf in the gradients the penalty is computed from skips the step (parameters and optimizer state "
            "bitwise untouched) and halves the scale once",
            detail="; ".join(problems),
            expected=0,
            allowance=0,
            unit="problems",
        ),
        device=amp_device,
        tags={"scale": [step.scale_before, step.scale_after]},
    )
