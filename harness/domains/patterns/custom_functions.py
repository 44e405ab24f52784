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

from harness.numerics.comparison import ClaimComparison, compare_claim

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


#: The two forms of a custom function: ``ctx`` (``forward(ctx, *inputs)``, the AMP examples' form)
#: and ``setup_context`` (``forward(*inputs)`` and a separate ``setup_context(ctx, inputs, output)``,
#: the form ``torch.func`` transforms and ``torch.compile`` ask for).
STYLES = ("ctx", "setup_context")


def functions(device_type: str, style: str = "ctx") -> dict[str, type[torch.autograd.Function]]:
    """A linear layer as a custom function in ``style`` (one of :data:`STYLES`), decorated both
    ways the AMP examples document: ``fp32`` (``custom_fwd(cast_inputs=torch.float32)``: an
    fp32-only kernel) and ``autocast`` (``custom_fwd`` without ``cast_inputs``: the forward runs
    under the caller's autocast)."""
    if style not in STYLES:
        raise ValueError(f"unknown custom function style {style!r}; choose one of {', '.join(STYLES)}")
    custom_fwd, custom_bwd = torch.amp.custom_fwd, torch.amp.custom_bwd

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        # no casts: a low-precision grad meets the fp32 saved inputs, which only autocast reconciles
        return torch.mm(grad, w), torch.mm(grad.t(), x)

    def make(cast_inputs: torch.dtype | None) -> type[torch.autograd.Function]:
        decorate = custom_fwd(device_type=device_type, cast_inputs=cast_inputs)
        decorated_backward = staticmethod(custom_bwd(device_type=device_type)(backward))
        if style == "ctx":

            class Linear(torch.autograd.Function):
                @staticmethod
                @decorate  # type: ignore[untyped-decorator]
                def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                    ctx.save_for_backward(x, w)
                    return torch.mm(x, w.t())

                backward = decorated_backward

            return Linear

        class SetupLinear(torch.autograd.Function):
            @staticmethod
            @decorate  # type: ignore[untyped-decorator]
            def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                return torch.mm(x, w.t())

            @staticmethod
            def setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
                ctx.save_for_backward(*inputs)

            backward = decorated_backward

        return SetupLinear

    return {"fp32": make(torch.float32), "autocast": make(None)}


@dataclass(frozen=True)
class Observed:
    """The dtypes the function's matmuls ran in, per phase; and the output's dtype."""

    forward: tuple[tuple[str, ...], ...]
    backward: tuple[tuple[str, ...], ...]
    output: str
    #: what the forward or backward raised (a backward run without the forward's autocast state
    #: meets a low-precision gradient and fp32 saved inputs: a dtype mismatch; custom_bwd finding no
    #: forward state to restore: an AttributeError), or None
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
    except (RuntimeError, AttributeError) as exc:  # what the function raised is the observation
        error = f"{rec.phase[-1]} raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    by = {p: tuple(m.dtypes for m in rec.seen if m.phase == p) for p in ("forward", "backward")}
    return Observed(by["forward"], by["backward"], output, error)


def claim(seen: Observed, kind: str, style: str, dtype: torch.dtype) -> ClaimComparison:
    """Every matmul of the function ``kind``-wise decorated, forward and backward, ran in the
    dtype its decorators promise (fp32 for ``fp32``, the autocast dtype for ``autocast``), one
    forward and two backward matmuls, nothing raised."""
    expected = "float32" if kind == "fp32" else str(dtype).removeprefix("torch.")
    calls = [(phase, d) for phase, calls in (("forward", seen.forward), ("backward", seen.backward)) for d in calls]
    wrong = [f"{phase} mm in {', '.join(d)}" for phase, d in calls if set(d) != {expected}]
    if seen.error:
        wrong.append(seen.error)
    if len(seen.forward) != 1 or len(seen.backward) != 2:
        wrong.append(
            f"{len(seen.forward)} forward and {len(seen.backward)} backward matmuls observed (1 and 2 expected)"
        )
    decorated = "custom_fwd(cast_inputs=torch.float32)" if kind == "fp32" else "custom_fwd"
    return compare_claim(
        f"custom_function.{kind}.matmuls_in_another_dtype"
        if style == "ctx"
        else f"custom_function.{style}.{kind}.matmuls_in_another_dtype",
        len(wrong),
        not wrong,
        f"every matmul of the custom function, forward and backward, runs in {expected}",
        detail=f"{decorated} ({style} form) under {dtype} autocast: " + "; ".join(wrong),
        expected=0,
        allowance=0,
        unit="matmuls",
    )


def lost_forward_state(seen: Observed) -> bool:
    """Whether ``seen`` is the registered setup_context issue's shape: the backward raised because
    ``custom_bwd`` found no forward autocast state on ctx (``_fwd_used_autocast``)."""
    return (
        seen.error is not None
        and seen.error.startswith("backward raised AttributeError")
        and ("_fwd_used_autocast" in seen.error)
    )


def setup_context_issue(device: torch.device) -> tuple[bool, str]:
    """The registered setup_context issue observed on ``device``: the fp32-only function in the
    setup_context form under bf16 autocast, forward and backward; present, and what was seen."""
    seen = observe(functions(device.type, "setup_context")["fp32"], device, torch.bfloat16)
    return lost_forward_state(seen), seen.error or f"ran: forward {seen.forward}, backward {seen.backward}"
