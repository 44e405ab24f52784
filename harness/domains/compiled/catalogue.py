"""The autocast catalogue under ``torch.compile``: each op, called as users call it, compiled on its
own with fp32 inputs under autocast; its output dtype against eager's.

An op Dynamo cannot capture (a graph break with nothing compiled, or an error while compiling)
runs eagerly and would agree with eager trivially, so it is reported as not compiled rather than
as agreeing: the claim counts only ops that went through the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from harness.domains.autocast.catalogue import CATALOGUE, OpCase
from harness.domains.autocast.probe import dtype_name, run_op
from harness.domains.autocast.repro import replayed
from harness.domains.compiled.repro import compiled_dtypes
from harness.domains.compiled.runs import Backend, compile_fn

if TYPE_CHECKING:
    from harness.domains.repro import FailureRepro


@dataclass(frozen=True)
class CompiledOp:
    name: str
    eager: str
    #: the compiled output's dtype; None when nothing was compiled (see ``why``)
    compiled: str | None
    why: str = ""


def observe(case: OpCase, device: torch.device, dtype: torch.dtype, backend: Backend) -> CompiledOp | None:
    """Eager and compiled output dtype of one op (None where the op raises eagerly: nothing to compare)."""
    args = case.make(torch.Generator().manual_seed(0), device)
    try:
        eager = dtype_name(run_op(case.fn, args, device.type, dtype).dtype)
    except RuntimeError:
        return None
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    try:
        compiled = run_op(compile_fn(case.fn, backend), args, device.type, dtype)
    except Exception as exc:  # a compile failure is a finding about the op, not a crash of the sweep
        return CompiledOp(case.name, eager, None, f"compiling failed: {type(exc).__name__}: {str(exc)[:160]}")
    if counters["stats"]["unique_graphs"] == before:
        return CompiledOp(case.name, eager, None, "Dynamo captured no graph (ran eagerly)")
    return CompiledOp(case.name, eager, dtype_name(compiled.dtype))


def sweep(device: torch.device, dtype: torch.dtype, backend: Backend) -> list[CompiledOp]:
    """Every catalogue op of ``device``, compiled one by one."""
    found = [observe(c, device, dtype, backend) for c in CATALOGUE if device.type in c.devices]
    return [f for f in found if f is not None]


def repro_of(ops: list[CompiledOp], device: torch.device, dtype: torch.dtype, backend: Backend) -> FailureRepro | None:
    """The standalone reproduction of a failed sweep: the ops whose compiled dtype is not eager's
    (at most ``MAX_CASES`` of :mod:`harness.domains.autocast.repro`), replayed from their captured
    calls, eager and compiled with the same backend. None where nothing differs, no call could be
    written, or the backend is a function of your own (the script would need your code)."""

    if not isinstance(backend, str):
        return None
    differing = (o for o in ops if o.compiled is not None and o.compiled != o.eager)
    cases = [
        (label, cap)
        for label, cap, _ in replayed(((o.name, o.name, "fp32_in", None) for o in differing), device, dtype)
    ]
    if not cases:
        return None
    return compiled_dtypes(
        f"catalogue ops whose output dtype under {device.type} autocast ({dtype}) compiled with {backend} is not "
        "eager's",
        cases,
        str(device),
        dtype,
        backend,
    )
