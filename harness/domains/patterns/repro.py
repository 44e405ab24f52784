"""The training patterns' reproductions: the AMP examples' patterns as scripts whose model and data
are seeded as the checks build them, so a script needs no saved tensors. Gradient accumulation
under GradScaler: the sum of the micro-batches under one scale, and an inf in any micro-batch
skipping the effective batch (``scripts/accumulation.py``)."""

from __future__ import annotations

import torch

from harness.domains.patterns import accumulation as A
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src

#: gradient accumulation under GradScaler, standalone: ``scripts/accumulation.py``
ACCUMULATION = ScriptTemplate(__package__ or "harness.domains.patterns", "accumulation")


def accumulation_repro(device: torch.device, dtype: torch.dtype, inf_in: int | None = None) -> FailureRepro:
    """One effective batch of the examples' accumulation loop: without ``inf_in``, the scale held
    and the accumulated gradient against the float64 sum of the micro-batches' own; with it, the
    step skipped and the scale halved once."""
    values = {
        "DEVICE": f"torch.device({device.type!r})",
        "DTYPE": dtype_src(dtype),
        "INF_IN": repr(inf_in),
        "WIDTH": repr(A.WIDTH),
        "MICRO": repr(A.MICRO),
        "MICRO_BATCHES": repr(A.MICRO_BATCHES),
        "SCALE": repr(A.SCALE),
    }
    judgement = "sum" if inf_in is None else "skip"
    code = ACCUMULATION.fill("parameters", "effective_batch", judgement, values=values)
    if inf_in is None:
        what = "gradient accumulation under GradScaler: scale changes and gradient elements over budget"
        allowance = "exact: one scale per effective batch; gamma_(k-1)(2^-24) of the micro-batches' magnitudes"
    else:
        what = f"gradient accumulation under GradScaler with an inf in micro-batch {inf_in}: promises broken"
        allowance = "exact: the step skipped bitwise and the scale halved once"
    return FailureRepro("patterns", what, code, allowance, device=device.type)
