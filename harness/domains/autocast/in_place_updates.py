"""A forward after an in-place update of its parameters, in one autocast region, sees the update.

Training loops wrap more than a forward in one autocast region: a step's update and the next
forward (an RL or distillation loop's inner epochs, an evaluation after the step), or a reference
model's weights swapped in with ``param.data.copy_`` and swapped out again (KL against a frozen
reference, an EMA evaluation). Autocast caches each parameter's low-precision cast for the
outermost region's life and never looks at the parameter again: the later forward computes with
the weights from before the update, and training silently freezes. The claim: the forward after
the update equals, bit for bit, the updated layer computed with its operands cast by hand (no
autocast, no cache). An update made between two regions (the documented loop) is seen, and passes.
The verdict is decided here; the suite states it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from harness.numerics.comparison import ClaimComparison, compare_claim


def _step(layer: nn.Module, out: torch.Tensor) -> None:
    """One SGD step on the output's squared sum (the parameters change in place)."""
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    out.float().pow(2).sum().backward()  # type: ignore[no-untyped-call]
    opt.step()


def _swap(layer: nn.Module, out: torch.Tensor) -> None:
    """Another model's weights copied in, as a reference model's are swapped in for its pass."""
    with torch.no_grad():
        for p in layer.parameters():
            p.data.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)).to(p.device))


#: How the parameters change between the two forwards.
UPDATES: dict[str, Callable[[nn.Module, torch.Tensor], None]] = {
    "optimizer_step": _step,
    "weights_swapped_in": _swap,
}
#: Where the update is made: inside the one region, or between two regions (the documented loop).
PLACES = ("inside_the_region", "between_regions")


def expected(layer: nn.Linear, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The layer's forward on its current parameters, cast by hand: what autocast's linear computes,
    without autocast or its cache."""
    bias = layer.bias.detach().to(dtype) if layer.bias is not None else None
    return nn.functional.linear(x.to(dtype), layer.weight.detach().to(dtype), bias)


def run(update: str, place: str, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(the forward after the update as the loop runs it, :func:`expected` of the updated layer)."""
    torch.manual_seed(0)
    layer = nn.Linear(16, 8).to(device)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device)
    if place == "inside_the_region":
        with torch.autocast(device.type, dtype=dtype):
            UPDATES[update](layer, layer(x))
            after = layer(x)
    else:
        with torch.autocast(device.type, dtype=dtype):
            out = layer(x)
        UPDATES[update](layer, out)
        with torch.autocast(device.type, dtype=dtype):
            after = layer(x)
    return after.detach(), expected(layer, x, dtype)


def claim(update: str, place: str, dtype: torch.dtype, after: torch.Tensor, reference: torch.Tensor) -> ClaimComparison:
    """The forward after the update is the forward of the updated parameters, cast by hand."""
    diff = (after.double() - reference.double()).abs().max().item()
    same = torch.equal(after, reference)
    return compare_claim(
        f"in_place_update.{update}.{place}.largest_difference",
        diff,
        same,
        "a forward after an in-place update of its parameters in an autocast region computes with the updated "
        "parameters, bit for bit as the updated parameters cast by hand give",
        detail=f"{update} {place.replace('_', ' ')}, {dtype}: largest difference from the updated parameters "
        f"{diff:.3g}" + ("" if same else " (the casts cached before the update were used)"),
        expected=0.0,
        allowance=0.0,
    )


def issue_present(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[bool, str]:
    """The registry's observation: does a forward after a step in the same region miss the step?"""
    seen = claim(
        "optimizer_step", "inside_the_region", dtype, *run("optimizer_step", "inside_the_region", device, dtype)
    )
    return not seen.holds, seen.detail[0]
