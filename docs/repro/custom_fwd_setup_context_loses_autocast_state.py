# Reproduces custom-fwd-setup-context-loses-autocast-state (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# a custom autograd function with a separate setup_context (the form torch.func and torch.compile
# ask for), decorated with torch.amp.custom_fwd and custom_bwd: backward raises AttributeError
# ('_fwd_used_autocast'), custom_fwd having marked its first input rather than ctx
# Where: pytorch/pytorch#132388 (open). Registered in amp-harness
# harness/domains/patterns/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python custom_fwd_setup_context_loses_autocast_state.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

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
