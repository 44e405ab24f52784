import sys

import torch
from torch.autograd.function import FunctionCtx

# A custom autograd function in the form torch.func transforms and torch.compile ask for: forward
# without ctx, a separate setup_context. Decorated with torch.amp.custom_fwd / custom_bwd as the
# AMP examples document, its backward raises AttributeError: custom_fwd records the forward's
# autocast state on its first argument, which in this form is an input tensor, not ctx, so
# custom_bwd finds nothing to restore. Reference: the same decorators on a forward(ctx, ...)
# function run forward and backward under CPU autocast.


def make(cast_inputs: torch.dtype | None) -> type[torch.autograd.Function]:
    class Linear(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu", cast_inputs=cast_inputs)  # type: ignore[untyped-decorator]
        def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.mm(x, w.t())

        @staticmethod
        def setup_context(ctx: FunctionCtx, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
            ctx.save_for_backward(*inputs)

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")  # type: ignore[untyped-decorator]
        def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x, w = ctx.saved_tensors  # type: ignore[attr-defined]
            return torch.mm(grad, w.to(grad.dtype)), torch.mm(grad.t(), x.to(grad.dtype))

    return Linear


g = torch.Generator().manual_seed(0)
x = torch.randn(8, 16, generator=g).requires_grad_(True)
w = torch.randn(16, 16, generator=g).requires_grad_(True)
outcome = {}
for cast_inputs in (torch.float32, None):
    for dtype in (torch.bfloat16, torch.float16):
        x.grad = w.grad = None
        try:
            with torch.autocast("cpu", dtype=dtype):
                out = make(cast_inputs).apply(x, w)  # type: ignore[no-untyped-call]
            torch.autograd.backward(out.float().sum())
            outcome[f"cast_inputs={cast_inputs}, {dtype}"] = "ran"
        except (AttributeError, RuntimeError) as exc:
            outcome[f"cast_inputs={cast_inputs}, {dtype}"] = f"raised {type(exc).__name__}: {exc}"
print(f"custom_fwd/custom_bwd with setup_context under CPU autocast: {outcome}")
sys.exit(0 if all(v == "ran" for v in outcome.values()) else 1)
