"""Claim family: ``torch.export`` keeps a module's autocast regions.

A module whose forward holds an autocast region, and inside it a region with autocast disabled
(a norm recomputed in fp32, as Hugging Face's rotary embeddings are), exported strict and
non-strict and its program run: it must give eager's outputs, dtypes and bits
(``harness/domains/compiled/exported.py``). The record says otherwise: the non-strict program ran
the regions in fp32 until 2.6; strict export never gave eager's outputs (2.5 raised, 2.6 and 2.7
ran the regions in fp32, from 2.8 the program stops on its own dtype assertion). Each is registered
with the releases its script showed it on: KNOWN there, observed by the registry check every run.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.compiled import exported
from harness.domains.compiled import known_issues as issues

pytestmark = pytest.mark.amp_capability("compiled AMP")

MODE_OF = {issue: mode for mode, issue in issues.EXPORT_ISSUES.items()}


@pytest.fixture(scope="module")
def export_runs() -> dict[tuple[str, str, torch.dtype], exported.ExportRun]:
    """Each (mode, device, dtype) exported and run once: the registry checks read the bf16 runs."""
    return {}


def _run(runs, mode, device, dtype) -> exported.ExportRun:
    key = (mode, str(device), dtype)
    if key not in runs:
        runs[key] = exported.run(mode, device, dtype)
    return runs[key]


def _needs(mode: str) -> None:
    why = exported.missing(mode)
    if why is not None:
        pytest.skip(why)


@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")  # each issue shows in bf16; fp16 costs two more exports
@pytest.mark.parametrize("mode", sorted(exported.MODES))
def test_an_exported_program_runs_the_autocast_regions_of_its_module(
    mode, amp_device, amp_dtype, amp_record, export_runs
):
    _needs(mode)
    seen = _run(export_runs, mode, amp_device, amp_dtype)
    result = exported.claim(mode, amp_dtype, seen)
    amp_record.require_unless_known(
        result,
        issues.KNOWN_ISSUES[issues.EXPORT_ISSUES[mode]],  # looked up per run: a test may swap the registry
        device=amp_device,
        dtype=amp_dtype,
        tags={"mode": mode},
    )


@pytest.mark.parametrize("issue_id", sorted(MODE_OF))
def test_known_issue_status_matches_the_registry(issue_id, amp_device, amp_record, export_runs):
    """Each export issue, observed in its mode under bf16 regions (the program not giving eager's
    outputs): present where the registry lists it is KNOWN; absent there, or present outside its
    range, fails naming the edit."""
    mode = MODE_OF[issue_id]
    _needs(mode)
    seen = _run(export_runs, mode, amp_device, torch.bfloat16)
    wrong = exported.differences(seen)
    what = "; ".join(wrong) or "the program gives eager's outputs"
    amp_record.require_registry(
        issues.KNOWN_ISSUES[issue_id], bool(wrong), f"{issues.WHERE} ({issue_id!r})", seen=what, device=amp_device
    )
