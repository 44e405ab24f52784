"""Claim family: autocast's weight cache gives a trained module its gradients after a grad-free pass.

A module evaluated without autograd (``torch.no_grad``, ``torch.inference_mode``: a teacher's or
reference pass, an evaluation inside the training step) and then trained, in one autocast region:
the training pass must give every parameter the gradient, bit for bit, that it gives alone in its
region (``harness/domains/autocast/cast_cache.py``). torch 2.4 to 2.10 reused the casts cached
without autograd history, and the weights before a LayerNorm got no gradient, silently
(pytorch/pytorch#142234, #158232): registered as a known issue, KNOWN on the releases that have it
and observed by the registry check on every run.
"""

from __future__ import annotations

import pytest

from harness.domains.autocast import cast_cache, known_issues
from harness.domains.autocast.known_issues import GRAD_FREE_CASTS, WHERE

pytestmark = pytest.mark.amp_capability("autocast policy")


@pytest.mark.parametrize("grad_free", sorted(cast_cache.GRAD_FREE))
def test_a_module_trained_after_a_grad_free_pass_in_one_autocast_region_gets_every_gradient(
    grad_free, amp_device, amp_dtype, amp_record
):
    reference, unstable = cast_cache.reference(amp_device, amp_dtype)
    amp_record.require_repeatable("cast_cache.reference_unrepeatable", unstable, device=amp_device, dtype=amp_dtype)
    checked = cast_cache.gradients(amp_device, amp_dtype, grad_free)
    result = cast_cache.claim(reference, checked, grad_free, amp_dtype)
    amp_record.require_unless_known(
        result,
        known_issues.KNOWN_ISSUES[GRAD_FREE_CASTS],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags={"grad_free": grad_free},
    )


def test_known_issue_status_matches_the_registry(amp_device, amp_record):
    """A no_grad pass, then a training pass, in one bf16 region, observed: gradients lost where the
    registry lists the issue is KNOWN; absent there, or lost outside its range, fails naming the edit."""
    present, seen = cast_cache.issue_present(amp_device)
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[GRAD_FREE_CASTS],
        present,
        f"{WHERE} ({GRAD_FREE_CASTS!r})",
        seen=seen,
        device=amp_device,
    )
