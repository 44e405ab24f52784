"""The autocast catalogue under ``torch.compile``: each op, called as users call it, compiled on its
own with fp32 inputs under autocast; its output dtype against eager's.

An op Dynamo cannot capture (a graph break with nothing compiled, or an error while compiling)
runs eagerly and would agree with eager trivially, so it is reported as not compiled rather than
as agreeing: the claim counts only ops that went through the backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.domains.compiled.runs import Backend, compile_fn
from harness.domains.engines.ops.catalogue import CATALOGUE, OpCase
from harness.domains.engines.ops.probe import dtype_name, run_op


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
