"""Autocast's weight cache across grad modes: a module evaluated without autograd, then trained,
in one autocast region.

Autocast caches the low-precision cast of each fp32 leaf weight for the rest of its region. Usage
puts grad-free passes and training passes in one region all the time: a reference or teacher pass
under ``torch.no_grad`` inside a trainer's autocast-wrapped loss (Hugging Face's Trainer, Lightning
and accelerate wrap the whole loss computation), an evaluation inside a training step. A cast made
without autograd carries no history; reused by the training pass, it cuts the weights off the
graph: torch 2.4 to 2.10 gave the weights before a LayerNorm no gradient at all, silently (without
one, backward raised), pytorch/pytorch#142234 and #158232, fixed by #165068.

The claim: the training pass after a grad-free pass gives every parameter the gradient, bit for
bit, that the training pass alone in its region gives. The verdict is decided here; the suite
states it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from harness.domains.engines.state import repeated, same_bits
from harness.numerics.comparison import ClaimComparison, compare_claim

#: The ways a pass runs without autograd; each is a context manager factory.
GRAD_FREE: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


def model(seed: int = 0) -> nn.Sequential:
    """Linear, LayerNorm, GELU, Linear: the LayerNorm's own parameters keep the loss differentiable
    when the Linear weights drop off the graph, which is what makes the fault silent."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8))


def batch(device: torch.device, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 16, generator=g).to(device)


@dataclass(frozen=True)
class Gradients:
    """Each parameter's gradient (None: it got none) after one training pass, or what raised."""

    grads: dict[str, torch.Tensor | None] = field(default_factory=dict)
    error: str | None = None

    def missing(self) -> list[str]:
        return [n for n, g in self.grads.items() if g is None]


def gradients(device: torch.device, dtype: torch.dtype, grad_free: str | None) -> Gradients:
    """One autocast region to ``dtype``: a pass of the model under ``grad_free`` (None: none), then
    a training pass whose loss is differentiated."""
    m = model().to(device)
    x = batch(device)
    try:
        with torch.autocast(device.type, dtype=dtype):
            if grad_free is not None:
                with GRAD_FREE[grad_free]():
                    m(x)
            loss = m(x).float().pow(2).mean()
        loss.backward()
    except RuntimeError as exc:  # a training pass cut off the graph entirely: the verdict, not a crash
        return Gradients(error=(str(exc).strip().splitlines() or [type(exc).__name__])[0])
    return Gradients({n: None if p.grad is None else p.grad.detach().clone() for n, p in m.named_parameters()})


def reference(device: torch.device, dtype: torch.dtype) -> tuple[Gradients, list[str]]:
    """The training pass alone in its region, run twice: its gradients, and the parameters whose
    gradients the two runs disagreed on (none where the device repeats it bit for bit)."""
    return repeated(lambda: gradients(device, dtype, None), differing)


def differing(a: Gradients, b: Gradients) -> list[str]:
    """The parameters whose gradients are not bitwise equal, NaN equal to NaN (or missing in either),
    or the error."""
    if a.error or b.error:
        return [f"raised {a.error or b.error}"]
    out = []
    for n in sorted(a.grads.keys() | b.grads.keys()):
        x, y = a.grads.get(n), b.grads.get(n)
        if x is None or y is None or not same_bits(x, y):
            out.append(n)
    return out


def claim(reference: Gradients, checked: Gradients, grad_free: str, dtype: torch.dtype) -> ClaimComparison:
    """The training pass after a ``grad_free`` pass gives the gradients of the training pass alone."""
    wrong = differing(reference, checked)
    missing = checked.missing()
    what = (
        f"backward raised: {checked.error}"
        if checked.error
        else f"no gradient for {', '.join(missing)}"
        if missing
        else f"gradients differ for {', '.join(wrong)}"
    )
    return compare_claim(
        f"cast_cache.{grad_free}_then_train.gradients_differing",
        len(wrong),
        not wrong,
        "a training pass after a grad-free pass of the same module in one autocast region gives every "
        "parameter the gradient, bit for bit, the training pass alone in its region gives",
        detail=f"{grad_free} pass, then a training pass, in one {dtype} autocast region: {what} (the training "
        "pass reused autocast's cached casts made without autograd; cache_enabled=False or a region of its "
        "own for each pass avoids it)",
        expected=0,
        allowance=0,
        unit="parameters",
    )


def issue_present(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[bool, str]:
    """The registry's observation: after a ``no_grad`` pass, does the training pass lose gradients?"""
    seen = gradients(device, dtype, "no_grad")
    if seen.error:
        return True, f"backward raised: {seen.error}"
    missing = seen.missing()
    return bool(missing), f"no gradient for {', '.join(missing)}" if missing else "every parameter has a gradient"
