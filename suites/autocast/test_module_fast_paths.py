"""Claim family: modules' fused inference fast paths run under autocast.

``nn.TransformerEncoderLayer`` and ``nn.MultiheadAttention`` answer inference (eval mode, no
autograd, batched inputs) with one fused op that calls others inside it; autocast must cast all of
their operands alike, or the fused op meets mixed dtypes and raises. torch 2.4 and 2.5 shipped
exactly that on the CPU (pytorch/pytorch#132613: every encoder layer's inference under CPU autocast
raised, fixed in 2.6): registered as a known issue, KNOWN on the releases that have it and observed
by the registry check on every run. Each module's fast path runs under the autocast dtype, is taken
(the profiler sees the fused op; a module that fell back is INCONCLUSIVE), and gives finite values.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.autocast import fast_paths
from harness.domains.autocast.known_issues import ENCODER_FAST_PATH, KNOWN_ISSUES, WHERE
from harness.domains.autocast.repro import fast_path_repro
from harness.numerics.verdict import Outcome

pytestmark = pytest.mark.amp_capability("autocast policy")

ISSUE = KNOWN_ISSUES[ENCODER_FAST_PATH]


@pytest.mark.parametrize("name", sorted(fast_paths.FAST_PATHS))
def test_a_modules_inference_fast_path_runs_under_autocast(name, amp_device, amp_dtype, amp_record):
    run = fast_paths.run_fast_path(name, amp_device, amp_dtype)
    listed = ISSUE.listed(torch.__version__, amp_device.type) and name.startswith("TransformerEncoderLayer")
    if listed and run.raised is not None:
        # the registry check below observes it on every run, so a release that fixes it is noticed
        amp_record(
            f"fast_path.{name}.runs_under_autocast", True, outcome=Outcome.KNOWN, device=amp_device, dtype=amp_dtype
        )
        pytest.skip(f"KNOWN on torch {torch.__version__}: {ISSUE.id} ({ISSUE.reference})")
    amp_record.require(
        fast_paths.fast_path_claim(name, amp_dtype, run),
        device=amp_device,
        dtype=amp_dtype,
        tags={"module": name, "fused": fast_paths.FAST_PATHS[name].fused, "output_dtype": run.dtype},
        repro=fast_path_repro(name, amp_device, amp_dtype),
    )


def test_known_issue_status_matches_the_registry(amp_device, amp_record):
    """The encoder layer's fast path under bf16 autocast, observed: present where the registry lists
    the issue is KNOWN; absent there, or present outside its range, fails naming the edit."""
    run = fast_paths.run_fast_path("TransformerEncoderLayer", amp_device, torch.bfloat16)
    present = run.raised is not None and "must have the same dtype" in run.raised
    amp_record.require_registry(
        ISSUE, present, f"{WHERE} ({ENCODER_FAST_PATH!r})", seen=run.raised or "ran", device=amp_device
    )
