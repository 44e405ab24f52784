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

pytestmark = pytest.mark.amp_capability("autocast policy")


def test_the_catalogue_reaches_every_op_pytorch_lists(amp_device, amp_record, autocast_lists_source):
    expectations = oracle.read_lists(amp_device.type, autocast_lists_source)
    uncovered = oracle.uncovered(expectations, amp_device.type)
    amp_record.require(
        oracle.coverage_claim(amp_device.type, uncovered),
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
    amp_record.require(
        oracle.disagreements_claim(amp_device.type, unexplained, findings, result.disagreements),
        dtype=amp_dtype,
        device=amp_device,
        tags={"checked": result.checked, "agreements": result.agreements, "known": len(known)},
        repro=lists_repro(unexplained, amp_device, amp_dtype),
    )
