"""Autocast's policy under ``torch.vmap``: a module mapped over a batch runs in the dtypes autocast
gives it unbatched.

``torch.vmap`` (``torch.func``) is how per-sample gradients (differential privacy, influence
functions) and model ensembles are written, and users run it under autocast like any forward.
The batching rules rewrite ops (``addmm`` into a matmul and an add, a convolution with its bias
into a convolution and an add) below autocast's dispatch, so a rewritten op can escape the policy:
from torch 2.4 to 2.15 a Linear or a convolution with a bias, vmapped under autocast, returns fp32
where its unbatched call returns the autocast dtype (the matmul runs in low precision, the bias
add in fp32; pytorch/pytorch#192617, open). The claim: each module's output under vmap has the
dtype of the same module called on the whole batch. The verdict is decided here; the suite
states it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from harness.numerics.comparison import ClaimComparison, compare_claim


@dataclass(frozen=True)
class Mapped:
    """A module, the batch it is called on (the first dimension is vmapped), and how it is called."""

    build: Callable[[], nn.Module]
    shape: tuple[int, ...]
    call: Callable[[nn.Module, torch.Tensor], torch.Tensor] = lambda m, x: m(x)


MODULES: dict[str, Mapped] = {
    "Linear": Mapped(lambda: nn.Linear(8, 6), (16, 8)),
    # no bias: nothing for the batching rule to add outside the matmul (passes where the others fail)
    "Linear.no_bias": Mapped(lambda: nn.Linear(8, 6, bias=False), (16, 8)),
    "Conv2d": Mapped(lambda: nn.Conv2d(3, 4, 3), (16, 3, 6, 6)),
    "MLP": Mapped(lambda: nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)), (16, 8)),
}


@dataclass(frozen=True)
class VmapRun:
    """The output dtype of the module on the whole batch and under vmap, or what raised."""

    unbatched: torch.dtype | None
    vmapped: torch.dtype | None
    raised: str | None = None


def run(name: str, device: torch.device, dtype: torch.dtype) -> VmapRun:
    """``name`` called on the whole batch and under ``torch.vmap``, both under autocast to ``dtype``."""
    spec = MODULES[name]
    torch.manual_seed(0)
    m = spec.build().to(device)
    x = torch.randn(*spec.shape, generator=torch.Generator().manual_seed(1)).to(device)
    try:
        with torch.autocast(device.type, dtype=dtype):
            whole = spec.call(m, x)
            mapped = torch.vmap(lambda t: spec.call(m, t))(x)
    except RuntimeError as exc:  # a batching rule that cannot run under autocast is the verdict
        return VmapRun(None, None, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
    return VmapRun(whole.dtype, mapped.dtype)


def claim(name: str, dtype: torch.dtype, seen: VmapRun) -> ClaimComparison:
    """The vmapped module's output dtype is the unbatched call's."""
    same = seen.raised is None and seen.vmapped == seen.unbatched
    what = (
        f"vmap raised: {seen.raised}"
        if seen.raised
        else f"unbatched {seen.unbatched}, vmapped {seen.vmapped}"
        + ("" if same else " (a batching rule ran part of the module outside autocast's policy)")
    )
    return compare_claim(
        f"vmap.{name}.output_dtype_differs",
        not same,
        same,
        "a module under torch.vmap gives the output dtype autocast gives the same module on the whole batch",
        detail=f"{name} under {dtype} autocast: {what}",
        expected=0,
        allowance=0,
    )


def issue_present(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[bool, str]:
    """The registry's observation: does a vmapped Linear with a bias leave autocast's dtype?"""
    seen = run("Linear", device, dtype)
    if seen.raised:
        return False, f"vmap raised: {seen.raised}"
    return seen.vmapped != seen.unbatched, f"unbatched {seen.unbatched}, vmapped {seen.vmapped}"
