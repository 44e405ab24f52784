"""Claim family: an overflow reaching attention under autocast stays visible.

GradScaler skips a step on a non-finite gradient and trainers stop on a non-finite loss; both need
an inf or NaN in an activation to reach the outputs. With one element of a query, key or value set
to inf or NaN, ``scaled_dot_product_attention`` under autocast must make exactly the outputs
non-finite that attention written out in float64 does (``harness/domains/autocast/nonfinite.py``),
at three sequence lengths, causal and not.

On the CPU two releases' kernels hide them, each registered as a known issue, KNOWN on the releases
that have it and observed by the registry check every run: a NaN comes out finite (in a query or a
key at every length on 2.5, pytorch/pytorch#141128; in a query at a short sequence from 2.6 on),
and from 2.9 an inf in a query or a key comes out finite at lengths 16 and 64 in bf16 and fp16 (not in
fp32).
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.autocast import known_issues
from harness.domains.autocast import nonfinite as N
from harness.domains.autocast.known_issues import WHERE

pytestmark = pytest.mark.amp_capability("numerics")


@pytest.mark.parametrize("value", sorted(N.VALUES))
@pytest.mark.parametrize("tensor", N.TENSORS)
def test_an_inf_or_nan_in_attention_makes_the_outputs_float64_makes_non_finite_non_finite(
    tensor, value, amp_device, amp_dtype, amp_record
):
    seen = N.observe(tensor, value, amp_device, amp_dtype)
    result = N.claim(seen, tensor, value, amp_dtype)
    tags = {"tensor": tensor, "value": value, "hidden": {s.where: s.hidden for s in seen}}
    if (tensor, value) not in N.ISSUE_CELLS:
        amp_record.require(result, device=amp_device, dtype=amp_dtype, tags=tags)
        return
    issue = N.ISSUE_CELLS[tensor, value][0]
    amp_record.require_unless_known(
        result,
        known_issues.KNOWN_ISSUES[issue],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags=tags,
        its_shape=N.only_hidden(seen, N.issue_lengths(issue, torch.__version__)),
    )


@pytest.mark.parametrize("issue", sorted({i for i, _ in N.ISSUE_CELLS.values()}))
def test_known_issue_status_matches_the_registry(issue, amp_device, amp_record):
    """Each attention issue observed under bf16 autocast on its first cell: outputs hidden where the
    registry lists it is KNOWN; propagated there, or hidden outside its range, fails naming the edit."""
    present, seen = N.issue_present(issue, amp_device)
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[issue], present, f"{WHERE} ({issue!r})", seen=seen, device=amp_device
    )
