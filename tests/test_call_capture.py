"""Calls kept as source replay what they recorded: every op of the autocast catalogue, captured
under autocast, gives the same output (dtype and bits) when its source runs on its saved inputs,
and a call that cannot be written down is refused, not approximated."""

from __future__ import annotations

import pytest
import torch

from harness.domains.call_capture import NotReplayable, capture
from harness.domains.engines.ops.catalogue import CATALOGUE, NOT_BITWISE_REPRODUCIBLE
from harness.domains.engines.ops.probe import INPUT_KINDS, bitwise_equal, replay, run_op

CPU = torch.device("cpu")


def _replayed(cap, dtype):
    ns = {"torch": torch}
    exec(cap.function("case"), ns)
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=dtype):
        return ns["case"](*cap.tensors.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_every_catalogue_op_replays_from_its_captured_source(dtype):
    cases = [c for c in CATALOGUE if "cpu" in c.devices and c.name not in NOT_BITWISE_REPRODUCIBLE]
    refused, differ = [], []
    for case in cases:
        try:
            cap = replay(case, CPU, dtype)
        except NotReplayable as exc:
            refused.append(f"{case.name}: {exc}")
            continue
        args = case.make(torch.Generator().manual_seed(0), CPU)
        try:
            want = run_op(case.fn, args, "cpu", dtype)
        except RuntimeError:
            want = None
        if want is None:
            assert cap.raised is not None, case.name
            with pytest.raises(RuntimeError):
                _replayed(cap, dtype)
            continue
        if not bitwise_equal(_replayed(cap, dtype), want):
            differ.append(case.name)
    assert not refused and not differ, (refused, differ)
    assert len(cases) > 150  # the catalogue, not an empty selection


def test_each_kind_of_input_is_captured_as_the_probe_makes_it():
    ln = next(c for c in CATALOGUE if c.name == "F.layer_norm")
    kinds = {k: replay(ln, CPU, torch.bfloat16, k) for k in INPUT_KINDS}
    assert all(t.dtype == torch.float32 for t in kinds["fp32_in"].tensors.values())
    assert all(t.dtype == torch.bfloat16 for t in kinds["lowp_in"].tensors.values())
    assert [t.dtype for t in kinds["mixed_in"].tensors.values()] == [torch.float32, torch.bfloat16, torch.bfloat16]
    with pytest.raises(ValueError, match="inputs must be one of"):
        replay(ln, CPU, torch.bfloat16, "fp64_in")


def test_a_call_that_cannot_be_written_down_is_refused():
    def hooked(x):
        x = x.clone().requires_grad_()
        x.register_hook(lambda g: g)  # a Python function as an argument: no literal for it
        return x * 2

    with pytest.raises(NotReplayable, match="function"):
        capture(hooked, (torch.randn(3),), lambda call: call())


def test_a_call_that_raised_is_kept_as_the_last_line():
    cap = capture(lambda a, b: torch.mm(a, b), (torch.randn(2, 3), torch.randn(2, 3)), lambda call: call())
    assert cap.result is None and cap.raised and cap.lines == ("torch.mm(x0, x1)",)
