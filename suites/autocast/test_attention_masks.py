"""Claim family: masked attention stays finite where the arithmetic does, under autocast as in fp32.

Local attention and padded batches give ``scaled_dot_product_attention`` an additive mask. With a
sliding window or left padding over a long sequence, every query still sees some keys, so every
output is finite in float64 arithmetic (``harness/domains/autocast/masked_attention.py``); a
blocked kernel that meets a whole block of masked keys must not make NaN rows there, under the amp
dtype's autocast or in fp32. On the CPU, torch 2.4.0's flash kernel did (pytorch/pytorch#127055,
fixed in 2.4.1 and 2.5): registered as a known issue, KNOWN there and observed by the registry
check on every run.
"""

from __future__ import annotations

import pytest

from harness.domains.autocast import known_issues
from harness.domains.autocast import masked_attention as M
from harness.domains.autocast.known_issues import MASKED_BLOCKS, WHERE

pytestmark = pytest.mark.amp_capability("numerics")


@pytest.mark.parametrize("mask", sorted(M.MASKS))
def test_attention_with_a_mask_that_leaves_each_query_some_keys_is_finite(mask, amp_device, amp_dtype, amp_record):
    seen = M.run(mask, amp_device, amp_dtype)
    amp_record.require_unless_known(
        M.claim(mask, amp_dtype, seen),
        known_issues.KNOWN_ISSUES[MASKED_BLOCKS],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags={"mask": mask, "autocast_rows": seen.autocast_bad, "fp32_rows": seen.fp32_bad},
        its_shape=seen.error is None,  # a kernel that raises is a failure of its own
    )


def test_known_issue_status_matches_the_registry(amp_device, amp_record):
    """The sliding window observed in fp32: NaN rows where the registry lists the issue is KNOWN;
    finite there, or NaN rows outside its range, fails naming the edit."""
    present, seen = M.issue_present(amp_device)
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[MASKED_BLOCKS], present, f"{WHERE} ({MASKED_BLOCKS!r})", seen=seen, device=amp_device
    )
