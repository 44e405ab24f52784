"""A region inside autocast with autocast disabled: compiled, it must stay fp32 forward and backward.

The pattern is everywhere in mixed-precision code (a numerically fragile head, a router, a loss
kept in fp32): ``with torch.autocast(device, enabled=False): out = layer(h.float())``. Eager runs
the region in fp32 and, with ``backward()`` called outside autocast, its backward too. The check
compares the compiled region with eager: output dtype and gradient dtypes equal, values within
twice the fp32 evaluation bound of the region's matrix products (each of eager and compiled is
within one bound of the exact product of the same inputs; :func:`harness.numerics.budgets.matmul_like`
with fp32 as the "low" format, fp32 accumulation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.domains.compiled.runs import Variant, compile_fn, configured
from harness.domains.engines.ops.probe import dtype_name
from harness.numerics import budgets
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP32

#: Rows (batch x sequence) and width of the region's input.
ROWS, WIDTH = 64, 64


class Region(nn.Module):
    """A low-precision linear layer, then an fp32 linear layer with autocast disabled."""

    def __init__(self) -> None:
        super().__init__()
        self.low = nn.Linear(WIDTH, WIDTH)
        self.fp32 = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.low(x)
        with torch.autocast(x.device.type, enabled=False):
            out = self.fp32(h.float())
        return h, out


def call_region(model: nn.Module, x: torch.Tensor) -> Any:
    return model(x)


@dataclass(frozen=True)
class RegionRun:
    h: torch.Tensor
    out: torch.Tensor
    grads: dict[str, torch.Tensor]


def run(fn: Callable[..., Any], model: Region, x: torch.Tensor, dtype: torch.dtype) -> RegionRun:
    """Forward under autocast(``dtype``), backward of ``out.sum()`` outside it."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=dtype):
        h, out = fn(model, x)
    out.float().sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return RegionRun(h.detach(), out.detach(), grads)


def make(device: torch.device, seed: int = 0) -> tuple[Region, torch.Tensor]:
    torch.manual_seed(seed)
    x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(2000 + seed)).to(device)
    return Region().to(device), x


def bounds_of(eager: RegionRun, model: Region) -> dict[str, torch.Tensor]:
    """Per compared quantity, the fp32 bound of one evaluation (from eager's own inputs: the
    low-precision ``h`` both runs feed the region, bitwise the same when the forward is honoured)."""
    h = eager.h.double()
    w = model.fp32.weight.detach().double()
    b = model.fp32.bias.detach().double()
    g = torch.ones(h.shape[0], w.shape[0], dtype=torch.float64, device=h.device)  # d sum(out) / d out
    return {
        "forward.out": budgets.matmul_like(h, w.T, WIDTH, FP32, torch.matmul, bias=b).bound,
        "grad.fp32.weight": budgets.matmul_like(g.T, h, ROWS, FP32, torch.matmul).bound,
        "grad.fp32.bias": budgets.summation(g, 0, FP32).bound,
    }


@dataclass(frozen=True)
class RegionComparison:
    """Compiled region against eager: dtypes, and the worst |compiled - eager| / (2 x bound)."""

    dtype: str
    variant: str
    dtypes: dict[str, tuple[str, str]]
    ratios: dict[str, float]

    def explain(self) -> tuple[str, ...]:
        lines = [f"{k}: eager {e}, compiled {c}" for k, (e, c) in self.dtypes.items() if e != c]
        lines += [
            f"{k}: |compiled - eager| is {r:.3g}x twice the fp32 evaluation bound (autocast leaked into the region?)"
            for k, r in self.ratios.items()
            if r > 1.0
        ]
        return tuple(lines)

    def claim(self, part: str) -> ClaimComparison:
        keys = [k for k in self.ratios if k.startswith(part)]
        worst = max((self.ratios[k] for k in keys), default=0.0)
        same_dtypes = all(e == c for k, (e, c) in self.dtypes.items() if k.startswith(part))
        return compare_claim(
            f"compiled.{self.variant}.{self.dtype}.autocast_disabled_region.{part}",
            worst,
            same_dtypes and worst <= 1.0,
            f"inside autocast({self.dtype}), a region with autocast disabled runs in fp32 in the compiled {part} as in "
            "eager: same dtypes, |compiled - eager| <= 2 x the fp32 bound of its matrix products",
            detail=tuple(line for line in self.explain() if line.startswith(part)),
            allowance=1.0,
        )


def compare(eager: RegionRun, compiled: RegionRun, model: Region, dtype: torch.dtype, variant: str) -> RegionComparison:
    bounds = bounds_of(eager, model)
    pairs = {"forward.out": (eager.out, compiled.out)}
    pairs.update({f"grad.{k}": (eager.grads[k], compiled.grads[k]) for k in ("fp32.weight", "fp32.bias")})
    dtypes = {k: (dtype_name(e.dtype), dtype_name(c.dtype)) for k, (e, c) in pairs.items()}
    ratios = {}
    for k, (e, c) in pairs.items():
        diff = (c.double() - e.double()).abs()
        ratios[k] = float((diff / (2 * bounds[k])).max())
    return RegionComparison(dtype_name(dtype), variant, dtypes, ratios)


class RegionRuns:
    """The region eager and compiled per (dtype, variant), each made once per session."""

    def __init__(self, device: torch.device, backend: Any) -> None:
        self.model, self.x = make(device)
        self.backend = backend
        self._eager: dict[torch.dtype, RegionRun] = {}
        self._compiled: dict[tuple[torch.dtype, str], RegionRun] = {}

    def eager(self, dtype: torch.dtype) -> RegionRun:
        if dtype not in self._eager:
            self._eager[dtype] = run(call_region, self.model, self.x, dtype)
        return self._eager[dtype]

    def compiled(self, dtype: torch.dtype, variant: Variant) -> RegionRun:
        key = (dtype, variant.name)
        if key not in self._compiled:
            with configured(variant):
                self._compiled[key] = run(compile_fn(call_region, self.backend), self.model, self.x, dtype)
        return self._compiled[key]

    def comparison(self, dtype: torch.dtype, variant: Variant) -> RegionComparison:
        return compare(self.eager(dtype), self.compiled(dtype, variant), self.model, dtype, variant.name)
