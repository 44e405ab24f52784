"""A region of another autocast dtype nested in an autocast region runs in its own dtype.

A block that must run in another low-precision dtype inside an autocast region (a float16 kernel
inside a bfloat16 forward, a bfloat16 block inside a float16 one) nests a second region. Autocast
caches the casts of parameters for the outermost region's life, keyed by the tensor alone and not
by the dtype it was cast to: a parameter the outer region cast already comes back in the outer
dtype. A layer's matmul then raises on mixed dtypes, and an op on parameters alone (a low-rank
adapter's merged update, ``A @ B``) silently runs in the outer dtype. The claim: each module's
output in the nested region is, bit for bit, the module with its operands cast to that dtype by
hand (no autocast, no cache). A module the outer region has not used yet has nothing cached and
passes. The verdict is decided here; the suite states it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from harness.numerics.comparison import ClaimComparison, compare_claim

LOW_PRECISION = (torch.bfloat16, torch.float16)


class AdapterProduct(nn.Module):
    """A low-rank adapter's merged update, ``A @ B``: a matmul of two parameters and no input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(8, 4))
        self.b = nn.Parameter(torch.randn(4, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a @ self.b


def _linear_by_hand(m: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    assert isinstance(m, nn.Linear) and m.bias is not None
    return nn.functional.linear(x.to(dtype), m.weight.detach().to(dtype), m.bias.detach().to(dtype))


def _product_by_hand(m: nn.Module, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    assert isinstance(m, AdapterProduct)
    return m.a.detach().to(dtype) @ m.b.detach().to(dtype)


@dataclass(frozen=True)
class Nested:
    """A module; its forward with the operands cast to a dtype by hand (no autocast, no cache: the
    reference); and whether the outer region uses it before the nested region does (which is what
    puts its parameters' casts in the cache)."""

    build: Callable[[], nn.Module]
    by_hand: Callable[[nn.Module, torch.Tensor, torch.dtype], torch.Tensor]
    used_outside_first: bool = True


MODULES: dict[str, Nested] = {
    "Linear": Nested(lambda: nn.Linear(16, 8), _linear_by_hand),
    "adapter_product": Nested(AdapterProduct, _product_by_hand),
    # nothing cached before the nested region: passes where the others do not
    "Linear.first_inside": Nested(lambda: nn.Linear(16, 8), _linear_by_hand, used_outside_first=False),
}


def outer_of(inner: torch.dtype) -> torch.dtype:
    """The other low-precision dtype: the outer region's, around a nested region of ``inner``."""
    return next(d for d in LOW_PRECISION if d != inner)


@dataclass(frozen=True)
class NestedRun:
    """The module's output with its operands cast to ``inner`` by hand (``by_hand``) and in the
    nested region (None: it raised)."""

    by_hand: torch.Tensor
    nested: torch.Tensor | None
    raised: str | None = None

    @property
    def same(self) -> bool:
        return (
            self.nested is not None
            and self.nested.dtype == self.by_hand.dtype
            and torch.equal(self.nested, self.by_hand)
        )

    def describe(self) -> str:
        if self.raised is not None:
            return f"the nested region raised: {self.raised}"
        assert self.nested is not None
        if self.nested.dtype != self.by_hand.dtype:
            return (
                f"{self.nested.dtype} in the nested region, {self.by_hand.dtype} cast by hand (the outer region's cast)"
            )
        diff = (self.nested.double() - self.by_hand.double()).abs().max().item()
        return f"{self.nested.dtype} as cast by hand, largest difference {diff:.3g}"


def run(name: str, device: torch.device, inner: torch.dtype) -> NestedRun:
    """``name`` cast to ``inner`` by hand, then in a region of ``inner`` nested in one of the other dtype."""
    spec = MODULES[name]
    torch.manual_seed(0)
    m = spec.build().to(device)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device)
    by_hand = spec.by_hand(m, x, inner)
    try:
        with torch.autocast(device.type, dtype=outer_of(inner)):
            if spec.used_outside_first:
                m(x)
            with torch.autocast(device.type, dtype=inner):
                nested = m(x)
    except RuntimeError as exc:  # a nested region that cannot run is the verdict
        return NestedRun(by_hand, None, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
    return NestedRun(by_hand, nested)


def claim(name: str, inner: torch.dtype, seen: NestedRun) -> ClaimComparison:
    """The nested region's output is the module's with its operands cast to the region's dtype by hand."""
    return compare_claim(
        f"nested_region.{name}.differs_from_cast_by_hand",
        not seen.same,
        seen.same,
        "a region of another autocast dtype nested in an autocast region gives, bit for bit, the module with its "
        "operands cast to that dtype by hand",
        detail=f"{name}, {inner} nested in {outer_of(inner)}: {seen.describe()}",
        expected=0,
        allowance=0,
    )


def issue_present(device: torch.device, inner: torch.dtype = torch.float16) -> tuple[bool, str]:
    """The registry's observation: does a Linear the outer region used come out unlike its cast by hand?"""
    seen = run("Linear", device, inner)
    return not seen.same, seen.describe()
