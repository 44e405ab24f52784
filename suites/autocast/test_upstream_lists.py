"""Claim family: the observed autocast policy is the one PyTorch itself expects.

PyTorch ships its autocast test lists with every wheel (``torch/testing/_internal/
autocast_test_lists.py``): which ops it expects in low precision, in fp32, promoted or banned,
for CUDA and for CPU. Every listed op the catalogue calls is judged against that expectation on
the device at hand; because the lists come with the installed torch, this judges a device's table
on its first run, before any golden table exists. A disagreement is a failure with both sides
shown, unless it is a registered finding of this torch release (then recorded as known, with a
check that notices when a release fixes it). The catalogue must reach every listed op, or say why
it cannot.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.autocast import oracle
from harness.domains.autocast.repro import coverage_repro, lists_repro
from harness.domains.engines.ops.probe import policy_table
from harness.domains.versions import minor
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("autocast policy")


def test_the_catalogue_reaches_every_op_pytorch_lists(amp_device, amp_record, autocast_lists_source):
    expectations = oracle.read_lists(amp_device.type, autocast_lists_source)
    uncovered = oracle.uncovered(expectations, amp_device.type)
    amp_record.require(
        compare_claim(
            f"upstream_lists.{amp_device.type}.uncovered",
            len(uncovered),
            not uncovered,
            f"every op of PyTorch's {oracle.CLASSES[amp_device.type]} is called by the catalogue, or "
            "INTERNAL_OPS / NOT_CALLABLE says why it cannot be",
            detail=f"not reached: {', '.join(uncovered)}; add a row to harness/domains/engines/ops/catalogue.py",
            expected=0,
            allowance=0,
            unit="ops",
        ),
        device=amp_device,
        tags={"listed": len(expectations)},
        repro=coverage_repro(amp_device.type, list(expectations), uncovered, autocast_lists_source)
        if uncovered
        else None,
    )


def test_observed_policy_agrees_with_pytorchs_own_lists(amp_device, amp_dtype, amp_record, autocast_lists_source):
    expectations = oracle.read_lists(amp_device.type, autocast_lists_source)
    result = oracle.judge(expectations, policy_table(amp_device, amp_dtype), amp_device.type, amp_dtype)
    dtype = str(amp_dtype).removeprefix("torch.")
    findings = oracle.registered(amp_device.type, minor(torch.__version__), dtype)
    unexplained, known = [], []
    for d in result.disagreements:
        finding = findings.get(d.case)
        if finding is not None:
            known.append(d)
            amp_record(
                f"upstream_lists.{d.case}",
                0,
                outcome="known",
                dtype=amp_dtype,
                device=amp_device,
                tags={"expected": d.expected.value, "observed": d.observed.value},
                note=f"{d.describe()}: {finding.summary}",
            )
        else:
            unexplained.append(d)
    fixed = sorted(set(findings) - {d.case for d in result.disagreements})
    amp_record.require(
        compare_claim(
            f"upstream_lists.{amp_device.type}.disagreements",
            len(unexplained),
            not unexplained and not fixed,
            f"every listed op behaves as PyTorch's {oracle.CLASSES[amp_device.type]} expects, or the difference "
            "is a registered finding of this torch release (KNOWN_DISAGREEMENTS)",
            detail=[
                *(d.describe() for d in unexplained),
                *(
                    f"{case}: registered as disagreeing in torch {minor(torch.__version__)}, but agrees now: remove it from "
                    "KNOWN_DISAGREEMENTS in harness/domains/autocast/oracle.py"
                    for case in fixed
                ),
            ],
            expected=0,
            allowance=0,
            unit="ops",
        ),
        dtype=amp_dtype,
        device=amp_device,
        tags={"checked": result.checked, "agreements": result.agreements, "known": len(known)},
        repro=lists_repro(unexplained, amp_device, amp_dtype),
    )
