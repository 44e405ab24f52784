"""Claim family: losses that share one set of logits compile, and compiled they match eager AMP
within the budget of one low-precision rounding per stage boundary.

A cross-entropy with a distillation term, an entropy bonus or a z-loss beside it reads the same
autocast logits through a softmax, a log-softmax and a logsumexp, and sums their gradients: the
row-reduction fusions Inductor's CPU backend applies there have shipped bugs that one loss never
reaches (torch 2.6 cannot compile a softmax and a log-softmax of the same logits,
differentiated). The program is ``harness/domains/compiled/heads.py``: compiled once per dtype
with every head; where that fails, each head alone names the ones that break it. Releases that
fail to compile it are registered known issues (KNOWN there); the registry check below observes
the issue on every run, so a release that fixes it, or brings it back, is noticed.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.compiled import heads
from harness.domains.compiled.known_issues import KNOWN_ISSUES, REMOVED_BUFFER, WHERE, is_removed_buffer
from harness.numerics.verdict import Outcome

pytestmark = pytest.mark.amp_capability("compiled AMP")


#: fp16 on the CPU is thorough-tier, as the suite's other compiles (one more cold compile of a
#: path CPUs rarely train in); bf16 shows the claim in the default tier.
@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")
def test_losses_sharing_logits_compile_and_match_eager_amp_within_the_budget(
    heads_runs, amp_device, amp_dtype, amp_record
):
    compiled = heads_runs.compiled(amp_dtype)
    tags = {"heads": ", ".join(heads.NAMES)}
    if compiled.error is not None:
        known = heads.registered_failures(compiled, amp_device.type)
        if known:  # the registry check below observes it on every run, so a release that fixes it is noticed
            amp_record("compiled.heads.builds", True, outcome=Outcome.KNOWN, device=amp_device, dtype=amp_dtype,
                       tags={**tags, "breaking": ", ".join(compiled.breaking())})  # fmt: skip
            ids = ", ".join(k.id for k in known)
            pytest.skip(f"KNOWN on torch {torch.__version__}: {ids} ({heads.describe_failure(compiled)})")
        amp_record.require(heads.build_claim(compiled), device=amp_device, dtype=amp_dtype, tags=tags)
    amp_record.require(heads_runs.judge(amp_dtype).claim(), device=amp_device, dtype=amp_dtype, tags=tags)


def test_known_issue_status_matches_the_registry(heads_runs, amp_device, amp_record, inductor_only):
    """The removed-buffer assertion, observed on the program's bf16 compile (no compile of its own
    where the program builds): present where the registry lists it is KNOWN; absent there, or
    present outside its range, fails naming the edit."""
    compiled = heads_runs.compiled(torch.bfloat16)
    hit = heads.failures_matching(compiled, is_removed_buffer)
    seen = ", ".join(f"{n}: {heads.describe_error(e)}" for n, e in hit.items()) or (
        "the program builds" if compiled.error is None else heads.describe_failure(compiled)
    )
    amp_record.require_registry(
        KNOWN_ISSUES[REMOVED_BUFFER], bool(hit), f"{WHERE} ({REMOVED_BUFFER!r})", seen=seen, device=amp_device
    )
