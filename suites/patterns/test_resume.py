"""A run saved mid-way and resumed continues exactly as if it had never stopped.

Model, optimizer, GradScaler and RNG state saved after step k and loaded into fresh objects (a
model initialised differently, a scaler at its initial scale) must give the uninterrupted run's
losses, loss scales and final parameters, bit for bit where the uninterrupted run repeats bit for bit (the CPU; a GPU's
deterministic kernels). Reference: the same run, not
interrupted."""

from __future__ import annotations

import pytest

from harness.domains.patterns import repeated
from harness.domains.patterns import resume as R
from harness.domains.patterns.repro import resume_repro
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("training parity")


def test_a_resumed_run_continues_bit_for_bit_as_the_uninterrupted_one(amp_device, amp_dtype, amp_record):
    uninterrupted, unstable = repeated(lambda: R.trajectory(amp_device, amp_dtype, None), R.differences)
    amp_record.require_repeatable("resume.reference_unrepeatable", unstable, device=amp_device, dtype=amp_dtype)
    resumed = R.trajectory(amp_device, amp_dtype, R.SAVE_AT)
    parted = R.differences(uninterrupted, resumed)
    amp_record.require(
        compare_claim(
            "resume.differences",
            len(parted),
            not parted,
            f"saved after step {R.SAVE_AT} and resumed in fresh objects, the run's losses, loss scales and final "
            "parameters equal the uninterrupted run's, bit for bit",
            detail=f"{amp_dtype}: " + "; ".join(parted[:6]),
            expected=0,
            allowance=0,
            unit="differences",
        ),
        device=amp_device,
        dtype=amp_dtype,
        tags={"steps": R.STEPS, "saved_after": R.SAVE_AT, "scales": list(uninterrupted.scales)},
        repro=resume_repro(amp_device, amp_dtype),
    )
