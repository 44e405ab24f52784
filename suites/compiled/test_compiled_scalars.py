"""Claim family: a Python scalar meets an autocast region's low-precision output in compiled code as
it does in eager.

Eager CPU rounds a Python float to the tensor's dtype before comparing, adding, subtracting or
taking a remainder (``h > 1.7`` on bf16 compares with 1.703125). At the rounded scalar that
decides: a threshold lets an element through or not, a loss's clamp passes its gradient or drops
it (pytorch/pytorch#185517: ``margin_ranking_loss`` gradients silently zeroed under
``torch.compile``), a remainder is 0 or almost a whole modulus. Random inputs never land there; each
case puts its input on the rounded scalar, and the compiled program must give eager's value
exactly (``harness/domains/compiled/scalars.py``); which rule eager followed (the rounded scalar,
or fp32 with the scalar as given) is recorded with each row. Releases that compile these otherwise
are registered known issues (``harness/domains/compiled/known_issues.py``): KNOWN there, observed
by the registry checks below on every run.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.compiled import scalars
from harness.domains.compiled.known_issues import KNOWN_ISSUES, WHERE
from harness.domains.compiled.repro import scalar_repro
from harness.numerics.verdict import Outcome

pytestmark = pytest.mark.amp_capability("compiled AMP")

CASES = [c.name for c in scalars.CASES]


#: fp16 on the CPU is thorough-tier, as the suite's other compiles: one more cold compile (about 5 s
#: on 2 cores) of a path CPUs rarely train in; the bf16 cells show every case in the default tier.
@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")
@pytest.mark.parametrize("case", CASES)
def test_compiled_code_rounds_a_python_scalar_as_eager_does(
    case, scalar_runs, amp_device, amp_dtype, amp_compile_backend, amp_record
):
    c = scalars.BY_NAME[case]
    eager = scalar_runs.eager(amp_dtype)
    comparison = scalars.judge(case, amp_dtype, scalar_runs.compiled(amp_dtype), eager)
    tags = {"case": case, "issue": c.issue}
    if eager.error is None:
        tags["eager_rule"] = scalars.eager_rule(case, amp_dtype, eager.values[case])
    issue = KNOWN_ISSUES[c.issue]
    if not comparison.passed and issue.listed(torch.__version__, amp_device.type) and amp_compile_backend == "inductor":
        # the registry check below observes it on every run, so a release that fixes it is noticed
        amp_record(f"compiled.scalars.{case}", True, outcome=Outcome.KNOWN, device=amp_device, dtype=amp_dtype,
                   tags=tags)  # fmt: skip
        pytest.skip(f"KNOWN on torch {torch.__version__}: {issue.id} ({issue.reference})")
    amp_record.require(
        comparison,
        device=amp_device,
        dtype=amp_dtype,
        tags=tags,
        repro=scalar_repro(amp_device, amp_dtype, amp_compile_backend, [case]),
    )


@pytest.mark.parametrize("issue_id", scalars.ISSUES)
def test_known_issue_status_matches_the_registry(issue_id, scalar_runs, amp_device, amp_record, inductor_only):
    """Each registered kind of op, observed in bf16 with Inductor: present (a case of it compiles
    to other values than eager's) where the registry lists it is KNOWN; absent there, or present
    outside its range, fails naming the edit."""
    cases = [c.name for c in scalars.CASES if c.issue == issue_id]
    compiled, eager = scalar_runs.compiled(torch.bfloat16), scalar_runs.eager(torch.bfloat16)
    judged = {n: scalars.judge(n, torch.bfloat16, compiled, eager) for n in cases}
    if compiled.error is not None or eager.error is not None:  # nothing observed: that is the finding
        amp_record.require(judged[cases[0]], device=amp_device)
    wrong = [n for n, j in judged.items() if not j.passed]
    amp_record.require_registry(
        KNOWN_ISSUES[issue_id],
        bool(wrong),
        f"{WHERE} ({issue_id!r})",
        seen=", ".join(wrong) or "none",
        device=amp_device,
    )
