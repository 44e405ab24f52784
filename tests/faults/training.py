"""Training-loop regressions: patched ``GradScaler.step`` and ``F.linear``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState

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
