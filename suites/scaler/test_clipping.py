"""Claim family: gradient clipping between GradScaler's unscale_ and step is clipping by its
definition, a non-finite norm skips the step, and error_if_nonfinite is honoured.

A small fp16-autocast model is trained under GradScaler with ``unscale_`` -> ``clip_grad_norm_``
-> ``step``, in both of clip_grad_norm_'s implementations (for-loop and foreach), with maximum
norms that bind and one that does not (``harness/domains/scaler/clipping.py``). The expected
total norm and clipped gradients are computed in float64 from the definition, from gradients the
harness unscales itself; a regression in ``clip_grad_norm_`` cannot move its own reference.
Pure low-precision training clips bf16 and fp16 gradients itself: the same definition judges it.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.domains.scaler import clipping as C
from harness.domains.scaler import known_issues as issues
from harness.domains.scaler.repro import clipping_repro_of
from harness.numerics.comparison import compare_within

pytestmark = pytest.mark.amp_capability("loss scaling")

IMPLEMENTATIONS = list(C.IMPLEMENTATIONS)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_clip_grad_norm_after_unscale_is_clipping_in_float64(implementation, amp_device, amp_record):
    foreach = C.IMPLEMENTATIONS[implementation]
    steps = C.observe(foreach, amp_device)
    actual, expected, budget = [], [], []
    coefficients = []
    first_over = None  # the first step over its budget: its script
    for o in steps:
        ref = C.clip_reference(o.unscaled, o.max_norm)
        coefficients.append(ref.coefficient)
        # the returned total norm, then every clipped gradient element
        got = torch.cat([torch.tensor([o.norm], dtype=torch.float64), *(c.flatten().double() for c in o.clipped)])
        want = torch.cat([torch.tensor([ref.total_norm]), *(r.flatten() for r in ref.grads)])
        bound = torch.cat(
            [torch.tensor([C.norm_budget(o.unscaled) * ref.total_norm]), *(b.flatten() for b in ref.budgets)]
        )
        if first_over is None and not bool(((got - want).abs() <= bound).all()):
            first_over = o
        actual.append(got)
        expected.append(want)
        budget.append(bound)
    binding = sum(c < 1.0 for c in coefficients)
    amp_record(
        f"clip.{implementation}.coefficients",
        min(coefficients),
        unit="min(1, max_norm / norm)",
        device=amp_device,
        tags={"per_step": coefficients, "max_norms": [o.max_norm for o in steps]},
        note="clip_grad_norm_'s coefficient at each step, from float64 (information)",
    )
    amp_record.require(
        C.binding_claim(implementation, coefficients),
        device=amp_device,
    )
    amp_record.require(
        compare_within(
            f"clip.{implementation}.vs_float64",
            torch.cat(actual),
            torch.cat(expected),
            torch.cat(budget),
            f"the returned total norm (first element of each step) and the clipped gradients against "
            f"{C.clip_reference(steps[0].unscaled, steps[0].max_norm).origin}",
            what=f"|{implementation} unscale_ + clip_grad_norm_ - float64|",
        ),
        device=amp_device,
        tags={"steps": len(steps), "binding": binding},
        repro=None if first_over is None else clipping_repro_of(first_over, foreach, "float64", amp_device),
    )


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_non_finite_gradient_gives_a_non_finite_norm_and_gradscaler_skips_the_step(
    implementation, amp_device, amp_record
):
    foreach = C.IMPLEMENTATIONS[implementation]
    steps = C.observe(foreach, amp_device, non_finite=True)
    judged = C.non_finite_claim(implementation, steps)
    first = judged.first
    amp_record.require(
        judged.claim,
        device=amp_device,
        tags={"norms": [str(o.norm) for o in steps], "planted": [str(o.planted) for o in steps]},
        repro=None if first is None else clipping_repro_of(first, foreach, "non_finite", amp_device),
    )


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_error_if_nonfinite_raises_and_leaves_the_gradients_as_they_were(implementation, amp_device, amp_record):
    foreach = C.IMPLEMENTATIONS[implementation]
    judged = C.error_if_nonfinite_claim(
        implementation,
        C.observe(foreach, amp_device, non_finite=True, error_if_nonfinite=True),
        C.observe(foreach, amp_device, error_if_nonfinite=True),
    )
    first = judged.first
    amp_record.require(
        judged.claim,
        device=amp_device,
        repro=None if first is None else clipping_repro_of(first, foreach, "error_if_nonfinite", amp_device),
    )


# -- low-precision gradients -------------------------------------------------------------------------
_FP16_OVERFLOW = issues.CLIP_FP16_OVERFLOW


@pytest.mark.parametrize("target", C.LOW_PRECISION_NORMS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_clip_grad_norm_of_low_precision_gradients_is_clipping_in_float64(
    implementation, dtype, target, amp_device, amp_record
):
    """Pure low-precision training clips its own bf16 or fp16 gradients (GradScaler refuses fp16
    ones): the returned norm and the clipped gradients must be the float64 definition's within two
    roundings to the gradients' dtype, for a total norm inside every format's range and one beyond
    float16's largest value (every element finite). From 2.4 to 2.15 float16's norm overflows to
    inf there and the gradients are zeroed: registered, KNOWN where listed."""
    seen = C.clip_low_precision(getattr(torch, dtype), C.IMPLEMENTATIONS[implementation], target, amp_device)
    result = C.low_precision_claim(implementation, seen)
    kw = {"device": amp_device, "dtype": dtype, "tags": {"target_norm": target, "returned_norm": seen.norm}}
    if dtype != "float16":
        amp_record.require(result, **kw)
        return
    amp_record.require_unless_known(
        result,
        issues.KNOWN_ISSUES[_FP16_OVERFLOW],  # looked up per run: a test may swap the registry
        its_shape=target > C.FP16_MAX and not math.isfinite(seen.norm),
        **kw,
    )


def test_the_fp16_norm_overflow_status_matches_the_registry(amp_device, amp_record):
    """float16 gradients of norm 1e5 observed: an inf norm and zeroed gradients where the registry
    lists the issue is KNOWN; a finite norm there, or the overflow outside its range, fails."""
    present, seen = C.fp16_norm_overflows(amp_device)
    amp_record.require_registry(
        issues.KNOWN_ISSUES[_FP16_OVERFLOW],
        present,
        f"KNOWN_ISSUES in harness/domains/scaler/known_issues.py ({_FP16_OVERFLOW!r})",
        seen=seen,
        device=amp_device,
    )
