"""A custom autograd function under autocast, standalone: a linear layer as a
``torch.autograd.Function`` decorated as the AMP examples document, ``custom_fwd(cast_inputs=
torch.float32)`` (an fp32-only kernel: every matmul, forward and backward, in float32) or
``custom_fwd`` without ``cast_inputs`` (the forward under the caller's autocast: every matmul in
the autocast dtype), ``custom_bwd`` running the backward under the forward's state; in the
``forward(ctx, ...)`` form or with a separate ``setup_context``. A dispatch mode
records each ``aten.mm`` with its inputs' dtypes; the function's own report is never consulted.

amp-harness writes a failed check's device, dtype and decoration over the defaults below
(``harness.domains.patterns.repro``); the inputs are seeded, as the check builds them. As it lies
it runs the fp32-only function under bf16 autocast on the CPU.
"""

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# -- parameters --
DEVICE = torch.device("cpu")
DTYPE = torch.bfloat16  # the autocast dtype
KIND = "fp32"  # "fp32": custom_fwd(cast_inputs=torch.float32); "autocast": custom_fwd without cast_inputs
STYLE = "ctx"  # "ctx": forward(ctx, x, w); "setup_context": forward(x, w) and a separate setup_context
WIDTH = 16  # the layer's width
BATCH = 8  # samples

# -- custom_function --


class Recorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Every aten.mm, with its inputs' dtypes and the phase it ran in."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.phase = "forward"
        self.seen: list[tuple[str, tuple[str, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.mm.default:
            dtypes = tuple(str(a.dtype).removeprefix("torch.") for a in args if isinstance(a, torch.Tensor))
            self.seen.append((self.phase, dtypes))
        return func(*args, **(kwargs or {}))


decorate = torch.amp.custom_fwd(device_type=DEVICE.type, cast_inputs=torch.float32 if KIND == "fp32" else None)


@torch.amp.custom_bwd(device_type=DEVICE.type)  # type: ignore[untyped-decorator]
def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x, w = ctx.saved_tensors
    return torch.mm(grad, w), torch.mm(grad.t(), x)


class CtxLinear(torch.autograd.Function):
    @staticmethod
    @decorate  # type: ignore[untyped-decorator]
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return torch.mm(x, w.t())

    backward = staticmethod(backward)


class SetupLinear(torch.autograd.Function):
    @staticmethod
    @decorate  # type: ignore[untyped-decorator]
    def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, w.t())

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        ctx.save_for_backward(*inputs)

    backward = staticmethod(backward)


Linear = CtxLinear if STYLE == "ctx" else SetupLinear


g = torch.Generator().manual_seed(0)
x = torch.randn(BATCH, WIDTH, generator=g).to(DEVICE).requires_grad_(True)
w = torch.randn(WIDTH, WIDTH, generator=g).to(DEVICE).requires_grad_(True)
rec = Recorder()
wrong = []
try:
    with rec:
        with torch.autocast(DEVICE.type, dtype=DTYPE):
            out = Linear.apply(x, w)  # type: ignore[no-untyped-call]
        rec.phase = "backward"
        torch.autograd.backward(out.float().sum())  # called outside autocast, as training loops call it
except (RuntimeError, AttributeError) as exc:
    wrong.append(f"{rec.phase} raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
expected = "float32" if KIND == "fp32" else str(DTYPE).removeprefix("torch.")
wrong += [f"{phase} mm in {', '.join(d)}" for phase, d in rec.seen if set(d) != {expected}]
forward = sum(phase == "forward" for phase, _ in rec.seen)
if forward != 1 or len(rec.seen) - forward != 2:
    wrong.append(f"{forward} forward and {len(rec.seen) - forward} backward matmuls observed (1 and 2 expected)")
print(
    f"custom function ({KIND}, {STYLE} form) under {DTYPE} autocast: "
    + ("; ".join(wrong) or f"every matmul in {expected}")
)
measured = len(wrong)  # matmuls in another dtype, and what raised
allowed = 0
