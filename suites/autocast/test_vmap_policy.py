"""Claim family: autocast's policy holds under ``torch.vmap``.

Per-sample gradients and model ensembles map a module over a batch with ``torch.vmap``, under
autocast like any forward. Each module's output under vmap must have the dtype autocast gives the
same module on the whole batch (``harness/domains/autocast/vmapped.py``). From torch 2.4 to 2.15 a
Linear or a convolution with a bias returns fp32 under vmap (the batching rule's bias add escapes
autocast; pytorch/pytorch#192617, open): registered as a known issue, KNOWN on the releases that
have it and observed by the registry check on every run; a Linear without a bias passes.
"""

from __future__ import annotations

import pytest

from harness.domains.autocast import known_issues, vmapped
from harness.domains.autocast.known_issues import VMAP_BIAS, WHERE

pytestmark = pytest.mark.amp_capability("autocast policy")


@pytest.mark.parametrize("name", sorted(vmapped.MODULES))
def test_a_module_under_vmap_gets_the_dtype_autocast_gives_it_unbatched(name, amp_device, amp_dtype, amp_record):
    seen = vmapped.run(name, amp_device, amp_dtype)
    result = vmapped.claim(name, amp_dtype, seen)
    amp_record.require_unless_known(
        result,
        known_issues.KNOWN_ISSUES[VMAP_BIAS],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags={"module": name},
        its_shape=seen.raised is None,  # a vmap that raised is a failure of its own
    )


def test_known_issue_status_matches_the_registry(amp_device, amp_record):
    """A vmapped Linear with a bias under bf16 autocast, observed: fp32 where the registry lists the
    issue is KNOWN; the autocast dtype there, or fp32 outside its range, fails naming the edit."""
    present, seen = vmapped.issue_present(amp_device)
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[VMAP_BIAS], present, f"{WHERE} ({VMAP_BIAS!r})", seen=seen, device=amp_device
    )
