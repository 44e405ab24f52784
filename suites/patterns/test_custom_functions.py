"""Custom autograd functions run in the precision their decorators promise.

``torch.amp.custom_fwd(cast_inputs=torch.float32)`` (an fp32-only kernel) runs the forward with
autocast disabled on fp32 inputs, and ``custom_bwd`` the backward under the forward's state: every
matmul of the function in fp32, forward and backward. Without ``cast_inputs`` the forward runs under
the caller's autocast, and so does the backward (``custom_bwd``): its matmuls in the autocast dtype.
Observed by a dispatch mode recording each ``aten.mm`` and its inputs' dtypes, not by the function.

Both forms of a custom function: ``forward(ctx, ...)`` and the separate ``setup_context`` that
``torch.func`` and ``torch.compile`` ask for. In the second, ``custom_bwd`` finds no forward state
and backward raises on every release from 2.4 to 2.15 (pytorch/pytorch#132388, open): registered
as a known issue, KNOWN where the registry lists it, and observed by the registry check every run."""

from __future__ import annotations

import pytest

from harness.domains.patterns import custom_functions as F
from harness.domains.patterns import known_issues
from harness.domains.patterns.known_issues import SETUP_CONTEXT, WHERE
from harness.domains.patterns.repro import custom_function_repro

pytestmark = pytest.mark.amp_capability("autocast policy")


@pytest.mark.parametrize("style", F.STYLES)
@pytest.mark.parametrize("kind", ["fp32", "autocast"])
def test_a_custom_functions_matmuls_run_in_the_precision_its_decorators_promise(
    kind, style, amp_device, amp_dtype, amp_record
):
    seen = F.observe(F.functions(amp_device.type, style)[kind], amp_device, amp_dtype)
    tags = {
        "kind": kind,
        "style": style,
        "forward": [list(d) for d in seen.forward],
        "backward": [list(d) for d in seen.backward],
    }
    repro = custom_function_repro(amp_device, amp_dtype, kind, style)
    result = F.claim(seen, kind, style, amp_dtype)
    if style == "ctx":
        amp_record.require(result, device=amp_device, dtype=amp_dtype, tags=tags, repro=repro)
        return
    amp_record.require_unless_known(
        result,
        known_issues.KNOWN_ISSUES[SETUP_CONTEXT],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags=tags,
        its_shape=F.lost_forward_state(seen),
        repro=repro,
    )


def test_known_issue_status_matches_the_registry(amp_device, amp_record):
    """The fp32-only function in the setup_context form under bf16 autocast, observed: backward
    raising for want of the forward's state where the registry lists the issue is KNOWN; running
    there, or raising outside its range, fails naming the edit."""
    present, seen = F.setup_context_issue(amp_device)
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[SETUP_CONTEXT], present, f"{WHERE} ({SETUP_CONTEXT!r})", seen=seen, device=amp_device
    )
