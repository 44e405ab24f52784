"""Claim family: torch.amp.GradScaler implements dynamic loss scaling exactly as specified.

A hypothesis state machine drives a real model and real optimizers (SGD with momentum, AdamW;
one or two optimizers) through clean steps, inf/-inf/NaN in any parameter's gradient, overflow
in one of two optimizers, unscale_ + clip_grad_norm_, gradient accumulation, update(new_scale)
with a float and a tensor, state_dict round trips into a fresh scaler, growth-interval changes,
and the documented misuse errors. After every rule the scale and growth tracker must equal the
float32-faithful reference (:mod:`harness.domains.scaler.reference`, torch semantics); a skipped step must leave
parameters and optimizer state bit-identical; a taken step must equal the optimizer's step on
gradients unscaled independently; unscale_ + clip_grad_norm_ must equal clipping computed in
float64 from its definition, within float32's budget. The machine is the domain's
(:class:`harness.domains.scaler.gradscaler_machine.GradScalerMachine`); this suite binds it to the
scaler and device under test and judges what it ran.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness.domains.scaler import known_issues as issues
from harness.domains.scaler import reference as scaling
from harness.domains.scaler.gradscaler_machine import (
    STEPS,
    UNCAPPED,
    GradScalerMachine,
    capped_growth_claim,
    exercised_claims,
)
from harness.domains.scaler.repro import hazard_repro, scaler_rules

pytestmark = pytest.mark.amp_capability("loss scaling")


def test_gradscaler_follows_the_reference_state_machine(amp_device, scaler_factory, amp_record):
    counts: Counter[str] = Counter()
    transcript: list[tuple[str, dict[str, object]]] = []
    machine = GradScalerMachine.bound(
        device=amp_device, scaler_cls=scaler_factory, counts=counts, transcript=transcript
    )
    amp_record.require_run(
        "rules_run",
        "model-based test of torch.amp.GradScaler against harness.domains.scaler.reference (torch): every rule's "
        "scale, growth tracker, skipped and taken steps, clipping and misuse errors as the reference says",
        lambda: run_state_machine_as_test(machine, settings=settings(stateful_step_count=STEPS)),
        device=amp_device,
        tags=counts,
        repro=lambda error: _rules_repro(error, scaler_factory, amp_device, transcript),
    )
    amp_record.require_all(exercised_claims(counts), device=amp_device)


#: The failures the standalone script judges (the machine's others: clipping, taken steps, misuse).
SCRIPTED = (scaling.Diverged.STATE, scaling.Diverged.SKIPPED_STEP)


def _rules_repro(error, scaler_cls, device, transcript):
    """The failing example's rules as a script, when what failed is what the script judges."""
    found = scaling.divergence_in(error)
    if device.type != "cpu" or found is None or found.what not in SCRIPTED:
        return None
    return scaler_rules(
        f"{scaler_cls.__name__}'s scale, growth tracker and skipped steps through the failing example's rules",
        f"{scaler_cls.__module__}.{scaler_cls.__qualname__}",
        transcript,
        cap_growth=not UNCAPPED.applies(torch.__version__, scaler_cls, device.type),
    )


def test_growth_is_capped_at_the_largest_float32(amp_device, scaler_factory, amp_record):
    """A growth that would overflow float32 is not applied (torch semantics), and the tracker resets."""
    p = torch.nn.Parameter(torch.ones(2, device=amp_device))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = scaler_factory(amp_device.type, init_scale=2.0**126, growth_factor=4.0, growth_interval=1)
    known = UNCAPPED.applies(torch.__version__, scaler_factory, amp_device.type)
    cfg = scaling.ScalerConfig(init_scale=2.0**126, growth_factor=4.0, growth_interval=1, cap_growth=not known)
    ref = scaling.ScalerState.initial(cfg)
    for _ in range(2):
        scaler.scale(p.sum()).backward()
        scaler.step(opt)
        scaler.update()
        ref = scaling.update("torch", cfg, ref, False)
    got = scaler.get_scale()
    amp_record.require(
        capped_growth_claim(got, ref.scale, known),
        repro=hazard_repro(
            f"{scaler_factory.__qualname__}: growth past float32's top",
            f"{scaler_factory.__module__}.{scaler_factory.__qualname__}",
            "capped_growth",
            amp_device.type,
            capped=not known,
        ),
        device=amp_device,
        tags={"scaler": issues.scaler_kind(scaler_factory)},
    )
