"""Training-loop regressions: patched ``GradScaler.step`` and ``F.linear``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState

from faults.stacks import kernel

Step = Callable[..., Any]


def scaler_step_flushing_small_gradients(real: Step, threshold: float = 1e-2) -> Step:
    """GradScaler.step that silently flushes unscaled gradients below a threshold to zero."""

    def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        self.unscale_(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.masked_fill_(p.grad.abs() < threshold, 0.0)
        return real(self, optimizer, *args, **kwargs)

    return step


def autocast_linear_dropping_bias(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A fused low-precision GEMM kernel that ignores the bias under autocast."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        return real(x, w, None if torch.is_autocast_enabled(x.device.type) else b)

    return linear


def scaler_silently_skipping_every_third_step(real: Step) -> Step:
    """GradScaler.step that drops every third optimizer step without backing off (undetectable
    as a skip from the scale)."""
    calls = {"n": 0}

    def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            self.unscale_(optimizer)
            self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
            return None
        return real(self, optimizer, *args, **kwargs)

    return step


def adamw_losing_fp32_update_precision(real: Step, keep_bits: int = 16) -> Step:
    """AdamW whose float32 update keeps only ``keep_bits`` significand bits of each parameter (an
    fp32 kernel regression; float64 parameters are untouched): fp32 and AMP training both run it,
    so parity moves with it and only the fp64 precision lane can see it."""
    drop = 24 - keep_bits

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.dtype is torch.float32:
                        bits = p.view(torch.int32)
                        bits.copy_((bits >> drop) << drop)  # truncate the low significand bits
        return out

    return step


def autocast_linear_accumulating_in_low_precision(
    real: Callable[..., torch.Tensor], chunk: int = 8
) -> Callable[..., torch.Tensor]:
    """A low-precision GEMM kernel that accumulates in the autocast dtype: the reduction runs in
    chunks of ``chunk`` products, each partial sum rounded to bf16/fp16 (instead of fp32)."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        kind = x.device.type
        if not torch.is_autocast_enabled(kind):
            return real(x, w, b)
        low = torch.get_autocast_dtype(kind)
        with torch.autocast(kind, enabled=False):
            xl, wl = x.to(low), w.to(low)
            total = torch.zeros((*x.shape[:-1], w.shape[0]), dtype=low, device=x.device)
            for k in range(0, x.shape[-1], chunk):
                part = real(xl[..., k : k + chunk].float(), wl[:, k : k + chunk].float(), None)
                total = (total.float() + part).to(low)
            return total if b is None else (total.float() + b.to(low).float()).to(low)

    return linear


def cross_entropy_in_low_precision(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A loss computed in the autocast dtype: logits rounded to bf16/fp16 and log-softmax there
    (the fp32 upcast of the logits before the loss lost)."""

    def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        kind = logits.device.type
        if not torch.is_autocast_enabled(kind) or logits.dtype == torch.float64:
            return real(logits, target, *args, **kwargs)
        low = torch.get_autocast_dtype(kind)
        with torch.autocast(kind, enabled=False):
            logp = torch.log_softmax(logits.to(low), dim=-1)
            return torch.nn.functional.nll_loss(logp, target, *args, **kwargs).float()

    return cross_entropy


def scaler_unscale_rounding_to_bf16(real: Step) -> Step:
    """GradScaler.unscale_ that leaves the unscaled gradients rounded to bf16 (a lossy unscale:
    3 of fp16's significand bits lost after the scale is divided out)."""

    def unscale_(self: GradScaler, optimizer: torch.optim.Optimizer) -> Any:
        out = real(self, optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.copy_(p.grad.to(torch.bfloat16))
        return out

    return unscale_


def scaler_step_rounding_master_weights(real: Step) -> Step:
    """GradScaler.step whose optimizer step leaves the fp32 master weights rounded to fp16 (the
    explainer's "no fp32 master weights", arrived at inside the scaler: an AMP-only fault)."""

    def step(self: GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        out = real(self, optimizer, *args, **kwargs)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.dtype == torch.float32:
                        p.copy_(p.to(torch.float16))
        return out

    return step


def optimizer_step_drifting_between_runs(original: Any) -> Any:
    """An optimizer step that is not reproducible: each call perturbs the first parameter by a
    relative 2^-20 times a process-wide call count (a race, an unordered reduction), so a second
    run of the same seed parts from the first."""
    calls = [0]

    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        calls[0] += 1
        with torch.no_grad():
            first = self.param_groups[0]["params"][0]
            first.mul_(1 + calls[0] * 2.0**-20)
        return out

    return step


@contextlib.contextmanager
def lossy_gelu_kernel(bits: int = 3) -> Iterator[None]:
    """aten::gelu's CPU kernel replaced by :func:`faults.training.lossy_gelu` (``bits`` significand
    bits of a bf16/fp16 output, float64 exact). Undone on exit."""
    lib = register_lossy_gelu(bits)
    try:
        yield
    finally:
        lib._destroy()


def recording_under_lossy_gelu(original: Any) -> Any:
    """``record_step`` run with :func:`lossy_gelu_kernel` in force: the recorded step's gelu is the
    faulty kernel (the rest of the run is untouched)."""

    def faulty(*args: Any, **kwargs: Any) -> Any:
        with lossy_gelu_kernel():
            return original(*args, **kwargs)

    return faulty


def lossy_gelu(bits: int = 3) -> Callable[..., torch.Tensor]:
    """An aten::gelu kernel keeping only ``bits`` significand bits of a bf16/fp16 output; float64
    calls stay exact, so the op localiser's reference is unaffected (a kernel regression in one op)."""
    import math

    def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        y = 0.5 * x.double() * (1 + torch.erf(x.double() / math.sqrt(2)))
        if x.dtype in (torch.bfloat16, torch.float16):
            m, e = torch.frexp(y)
            y = torch.ldexp(torch.round(m * 2.0**bits) / 2.0**bits, e)
        return y.to(x.dtype)

    return gelu


def register_lossy_gelu(bits: int = 3) -> Any:
    """:func:`lossy_gelu` as aten::gelu's CPU kernel while the returned Library lives."""
    return kernel("gelu", lossy_gelu(bits), "CPU")
