"""Custom autograd functions under autocast: ``torch.amp.custom_fwd(device_type, cast_inputs=...)``
runs the forward with autocast disabled on floating inputs cast to ``cast_inputs``; without
``cast_inputs`` the forward runs under the caller's autocast state; ``custom_bwd`` runs the
backward under the forward's state. What each matmul of the function computed in is observed by a
dispatch mode that records every ``aten.mm`` with its inputs' dtypes and the phase it ran in: the
function's own report is never consulted.

The functions are built when asked for (:func:`functions`), with ``torch.amp.custom_fwd`` and
``custom_bwd`` as they are then: a decorator under test is looked up, not frozen at import."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

WIDTH, BATCH = 16, 8


@dataclass
class MatmulSeen:
    phase: str
    dtypes: tuple[str, ...]


class _Recorder(TorchDispatchMode):
    """Every aten.mm, with its inputs' dtypes and the phase (``forward``/``backward``) it ran in."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.phase: list[str] = ["forward"]
        self.seen: list[MatmulSeen] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.mm.default:
            dtypes = tuple(str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor))
            self.seen.append(MatmulSeen(self.phase[-1], dtypes))
        return func(*args, **(kwargs or {}))


def functions(device_type: str) -> dict[str, type[torch.autograd.Function]]:
    """A linear layer as a custom function, decorated both ways the AMP examples document:
    ``fp32`` (``custom_fwd(cast_inputs=torch.float32)``: an fp32-only kernel) and ``autocast``
    (``custom_fwd`` without ``cast_inputs``: the forward runs under the caller's autocast)."""
    custom_fwd, custom_bwd = torch.amp.custom_fwd, torch.amp.custom_bwd

    def make(cast_inputs: torch.dtype | None) -> type[torch.autograd.Function]:
        class Linear(torch.autograd.Function):
            @staticmethod
            @custom_fwd(device_type=device_type, cast_inputs=cast_inputs)  # type: ignore[untyped-decorator]
            def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                ctx.save_for_backward(x, w)
                return torch.mm(x, w.t())

            @staticmethod
            @custom_bwd(device_type=device_type)  # type: ignore[untyped-decorator]
            def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                x, w = ctx.saved_tensors
                # no casts: a low-precision grad meets the fp32 saved inputs, which only autocast reconciles
                return torch.mm(grad, w), torch.mm(grad.t(), x)

        return Linear

    return {"fp32": make(torch.float32), "autocast": make(None)}


@dataclass(frozen=True)
class Observed:
    """The dtypes the function's matmuls ran in, per phase; and the output's dtype."""

    forward: tuple[tuple[str, ...], ...]
    backward: tuple[tuple[str, ...], ...]
    output: str
    #: what the forward or backward raised (a backward run without the forward's autocast state
    #: meets a low-precision gradient and fp32 saved inputs: a dtype mismatch), or None
    error: str | None = None


def observe(fn: type[torch.autograd.Function], device: torch.device, dtype: torch.dtype) -> Observed:
    """``fn`` on fp32 inputs under autocast to ``dtype``, and its backward (called outside autocast,
    as training loops call it), under the recording dispatch mode."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, WIDTH, generator=g).to(device).requires_grad_(True)
    w = torch.randn(WIDTH, WIDTH, generator=g).to(device).requires_grad_(True)
    rec = _Recorder()
    apply: Callable[..., torch.Tensor] = fn.apply
    output, error = "", None
    try:
        with rec:
            with torch.autocast(device.type, dtype=dtype):
                out = apply(x, w)
            output = str(out.dtype).removeprefix("torch.")
            rec.phase.append("backward")
            torch.autograd.backward(out.float().sum())
    except RuntimeError as exc:  # what the function raised is the observation
        error = f"{rec.phase[-1]} raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    by = {p: tuple(m.dtypes for m in rec.seen if m.phase == p) for p in ("forward", "backward")}
    return Observed(by["forward"], by["backward"], output, error)
