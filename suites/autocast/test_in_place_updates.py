"""Claim family: a forward after an in-place parameter update in an autocast region sees the update.

Loops that keep one autocast region around a step's update and the next forward, or around a
reference model's weights swapped in, must compute that forward with the updated parameters: bit
for bit the updated layer with its operands cast by hand, no autocast and no cache
(``harness/domains/autocast/in_place_updates.py``).
Autocast caches each parameter's cast for the outermost region's life and never looks at the
parameter again, so the later forward uses the weights from before the update and training silently
freezes. Registered as a known issue, KNOWN on the releases that have it and observed by the
registry check on every run; the documented loop, the update between two regions, passes.
"""

from __future__ import annotations

import pytest

from harness.domains.autocast import in_place_updates, known_issues
from harness.domains.autocast.known_issues import STALE_CASTS, WHERE

pytestmark = pytest.mark.amp_capability("autocast policy")


@pytest.mark.parametrize("place", in_place_updates.PLACES)
@pytest.mark.parametrize("update", sorted(in_place_updates.UPDATES))
def test_a_forward_after_an_in_place_update_computes_with_the_updated_parameters(
    update, place, amp_device, amp_dtype, amp_record
):
    after, reference = in_place_updates.run(update, place, amp_device, amp_dtype)
    amp_record.require_unless_known(
        in_place_updates.claim(update, place, amp_dtype, after, reference),
        known_issues.KNOWN_ISSUES[STALE_CASTS],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags={"update": update, "place": place},
        its_shape=place == "inside_the_region",  # between two regions the cache is gone: a failure of its own
    )


def test_known_issue_status_matches_the_registry(amp_device, amp_record):
    """An optimizer step, then a forward, in one bf16 region, observed: the weights before the step
    where the registry lists the issue is KNOWN; the step seen there, or missed outside its range,
    fails naming the edit."""
    present, seen = in_place_updates.issue_present(amp_device)
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[STALE_CASTS], present, f"{WHERE} ({STALE_CASTS!r})", seen=seen, device=amp_device
    )
