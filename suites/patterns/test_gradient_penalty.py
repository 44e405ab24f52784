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
from harness.domains.patterns.repro import penalty_repro

pytestmark = pytest.mark.amp_capability("loss scaling")


def test_the_penalty_is_the_float64_norm_of_the_unscaled_gradients(amp_device, amp_dtype, amp_record):
    step = P.penalised_step(amp_device, amp_dtype)
    amp_record.require(
        P.penalty_claim(step),
        dtype=amp_dtype,
        device=amp_device,
        repro=penalty_repro(amp_device, amp_dtype, "penalty"),
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
    amp_record.require(
        P.unscaled_claim(scaled, plain),
        dtype=amp_dtype,
        device=amp_device,
        repro=penalty_repro(amp_device, amp_dtype, "unscaled"),
    )


def test_an_inf_in_the_penalty_gradients_skips_the_step_and_backs_off_once(amp_device, amp_record):
    step = P.penalised_step(amp_device, torch.float16, inf_in_penalty_grads=True)  # the dtype GradScaler is for
    amp_record.require(
        P.overflow_claim(step),
        device=amp_device,
        tags={"scale": [step.scale_before, step.scale_after]},
        repro=penalty_repro(amp_device, torch.float16, "skip"),
    )
