"""Claim family: an overflow anywhere in an fp16 training step is skipped, backs the scale off,
and training recovers; the scaler's hazards are recorded findings, each with a check.

Overflow is injected at step k in the forward pass (fp16 activations beyond 65504), the backward
pass (an inf/NaN gradient in one layer) and the loss. A golden trace (scale and skip per step for
a fixed overflow pattern) is a baseline per torch release. Behaviour differences between torch
releases live in the known-issues registry (:data:`harness.domains.scaler.known_issues.KNOWN_ISSUES`), so they show
as known, and a fixed release is noticed.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.domains.scaler import known_issues as issues
from harness.domains.scaler import optimizers
from harness.domains.scaler import overflow as O
from harness.domains.scaler.repro import hazard_repro, scaler_trace
from harness.domains.versions import minor
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("loss scaling")


@pytest.mark.parametrize(("where", "what"), [("forward", "huge"), ("backward", "inf"), ("loss", "inf")])
def test_an_injected_overflow_is_skipped_backs_off_and_training_recovers(
    where, what, amp_device, scaler_factory, amp_record
):
    trainer = O.Trainer(amp_device, scaler_factory, O.inject_at(O.INJECT_AT, where, what))
    trace = [trainer.step() for _ in range(O.STEPS)]
    for row in trace:
        amp_record(
            f"trace.{where}.scale",
            row["scale"],
            device=amp_device,
            dtype="float16",
            tags={"step": row["step"], "skipped": row["skipped"], "loss": row["loss"]},
        )
    amp_record.require(
        O.recovery_claim(where, trace),
        device=amp_device,
        repro=scaler_trace(
            f"{scaler_factory.__qualname__} trace with an overflow in the {where} at step {O.INJECT_AT}: steps whose "
            "scale or skip differ from the scaler's rule",
            f"{scaler_factory.__module__}.{scaler_factory.__qualname__}",
            O.GROWTH_INTERVAL,
            (O.INJECT_AT,),
            O.STEPS,
            where,
        ),
    )


def test_the_scale_and_skip_trace_matches_the_golden_trace(amp_device, scaler_factory, amp_record, amp_baseline):
    pattern = {2, 3, 7}  # backward overflows at these steps
    trainer = O.Trainer(amp_device, scaler_factory, lambda s, w: "inf" if (w == "backward" and s in pattern) else None)
    trace = [trainer.step() for _ in range(12)]
    golden = [{"step": r["step"], "scale": r["scale"], "skipped": r["skipped"]} for r in trace]
    amp_record("golden_trace.steps", len(golden), device=amp_device, tags={"overflow_steps": sorted(pattern)})
    amp_baseline.check(
        f"golden_trace_{amp_device.type}",
        golden,
        key=KeyKind.STACK,
        device=str(amp_device),
        # the golden trace was recorded from the scaler's rule; the script holds the trace to the rule itself
        repro=lambda _differences, _stored: scaler_trace(
            f"{scaler_factory.__qualname__} trace with backward overflows at steps {sorted(pattern)}: steps whose "
            "scale or skip differ from the scaler's rule",
            f"{scaler_factory.__module__}.{scaler_factory.__qualname__}",
            O.GROWTH_INTERVAL,
            sorted(pattern),
            len(golden),
            "backward",
        ),
    )


# -- hazards: recorded findings, each with a check ----------------------------------------------
def _hazard(scaler_factory, hazard: str, device):
    """The hazard's script on the scaler under test (where it is importable standalone)."""
    return hazard_repro(
        f"{scaler_factory.__qualname__}: the recorded hazard {hazard} no longer holds",
        f"{scaler_factory.__module__}.{scaler_factory.__qualname__}",
        hazard,
        device.type,
    )


def test_finding_the_scale_has_no_floor_and_a_zero_scale_corrupts_parameters(amp_device, scaler_factory, amp_record):
    """torch backs off without a lower bound: after enough consecutive overflows the float32 scale
    is exactly 0. The next clean step scales every gradient to 0, and unscaling multiplies by
    1/0 = inf: 0 * inf = NaN. The inf/NaN check runs on the scaled gradients (all 0, finite)
    before that multiply, so the NaN is not detected and the step writes NaN into the parameters."""
    amp_record.require_all(
        O.zero_scale_findings(scaler_factory(amp_device.type), amp_device),
        device=amp_device,
        repro_of=lambda _: _hazard(scaler_factory, "zero_scale", amp_device),
    )


def test_finding_unscaling_overflows_undetected_below_a_scale_of_2_to_the_minus_128(
    amp_device, scaler_factory, amp_record
):
    """Below 2^-128, 1/scale is inf in float32: unscaling turns finite gradients into inf after the
    inf check, so the step writes inf into the parameters (and only the next step is skipped)."""
    scaler = scaler_factory(amp_device.type)
    amp_record.require(
        O.tiny_scale_finding(scaler, amp_device),
        device=amp_device,
        tags={"scale": scaler.get_scale()},
        repro=_hazard(scaler_factory, "tiny_scale", amp_device),
    )


def test_finding_a_nan_loss_with_finite_gradients_is_not_skipped(amp_device, scaler_factory, amp_record):
    """GradScaler inspects gradients only: a loss that is NaN through a detached term (finite
    gradients) is stepped on. Check the loss yourself if it can be NaN without NaN gradients."""
    amp_record.require(
        O.nan_loss_finding(scaler_factory(amp_device.type), amp_device),
        device=amp_device,
        repro=_hazard(scaler_factory, "nan_loss", amp_device),
    )


# -- known issues registry --------------------------------------------------------------------
def _torch_minor() -> str:
    return minor(torch.__version__)


def _observe(issue_id: str, device: torch.device, scaler_cls: type[torch.amp.GradScaler]) -> bool:
    """True when the issue's behaviour is present in this torch."""
    p = torch.nn.Parameter(torch.ones(2, device=device))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = scaler_cls(device.type)
    if issue_id == "update-int-new-scale":
        scaler.scale(p.sum()).backward()
        scaler.step(opt)
        try:
            scaler.update(1024)  # type: ignore[arg-type]
        except (AttributeError, AssertionError, TypeError):
            return True
        return scaler.get_scale() != 1024.0
    if issue_id == "sharded-cpu-growth-uncapped":
        capped = scaler_cls(device.type, init_scale=2.0**127, growth_factor=2.0, growth_interval=1)
        capped.scale(p.sum()).backward()
        capped.step(opt)
        capped.update()
        return not math.isfinite(capped.get_scale())
    if issue_id == "update-before-scale-after-load":
        fresh = scaler_cls(device.type)
        fresh.load_state_dict(scaler.state_dict())
        try:
            fresh.update(512.0)
        except (AssertionError, RuntimeError):
            return True
        return False
    if issue_id == optimizers.FUSED_SGD_FIRST_STEP:
        return optimizers.first_step_overflow_uses_uninitialised_momentum(device, scaler_cls)
    if issue_id == optimizers.FUSED_SGD_LOW_PRECISION:
        return optimizers.fused_sgd_skips_low_precision_vector_blocks(device)
    raise KeyError(issue_id)


@pytest.mark.parametrize("issue_id", sorted(set(issues.KNOWN_ISSUES) - {issues.CLIP_FP16_OVERFLOW}))
def test_known_issue_status_matches_the_registry(issue_id, amp_device, scaler_factory, amp_record):
    issue = issues.KNOWN_ISSUES[issue_id]
    present = _observe(issue_id, amp_device, scaler_factory)
    kind = issues.scaler_kind(scaler_factory)
    amp_record.require_registry(
        issue,
        present,
        f"KNOWN_ISSUES[{issue_id!r}] (harness/domains/scaler/known_issues.py)",
        device=amp_device,
        listed=issue.applies(torch.__version__, scaler_factory, amp_device.type),
        context=f" with {kind} on {amp_device.type}",
        tags={"scaler": kind},
    )
