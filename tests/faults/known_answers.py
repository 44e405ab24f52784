"""Faults of the known-answers family: a card with a defective low-precision GEMM unit, a stuck output lane or an intermittent bit flip, as dispatcher kernels. Each is a factory ``fault(original) -> replacement`` or a
subclass wrong in one way, named by the negative controls that inject it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _gemm_kernels(post: Callable[[torch.Tensor], None]) -> Any:
    """aten::mm, addmm and bmm's CPU kernels with ``post`` applied to every bf16 result in place
    (a defective card's low-precision unit), other dtypes untouched, while the Library lives."""
    import warnings

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.mm.out(a, b, out=out)
        post(out)
        return out

    def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any = 1, alpha: Any = 1) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.addmm.out(c, a, b, beta=beta, alpha=alpha, out=out)
        post(out)
        return out

    def bmm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        torch.ops.aten.bmm.out(a, b, out=out)
        post(out)
        return out

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, kernel in (("mm", mm), ("addmm", addmm), ("bmm", bmm)):
            lib.impl(op, kernel, "CPU")  # type: ignore[no-untyped-call]
    return lib


#: the stuck lane: one output column in every STUCK_EVERY of a bf16 GEMM
STUCK_EVERY = 64


def register_bf16_gemm_stuck_lane() -> Any:
    """A card whose bf16 GEMM unit has a stuck lane: the lowest mantissa bit of one output column in
    every 64 is forced to 1 (at most one ulp, every call): no tolerance sees it."""

    def stuck(out: torch.Tensor) -> None:
        if out.dtype == torch.bfloat16:
            out[..., ::STUCK_EVERY].view(torch.int16).bitwise_or_(1)

    return _gemm_kernels(stuck)


#: the intermittent fault's rate: one bf16 GEMM call in this many has one bit flipped
FLIP_EVERY = 300


def register_bf16_gemm_intermittent_flip(seed: int = 0, every: float = FLIP_EVERY) -> Any:
    """A card that flips one bit (the lowest of the mantissa) of one element of a bf16 GEMM's result
    in about one call of ``every``, at random (seeded): a transient fault."""
    import random

    rng = random.Random(seed)

    def flip(out: torch.Tensor) -> None:
        if out.dtype == torch.bfloat16 and out.numel() and rng.random() < 1 / every:
            out.view(-1)[rng.randrange(out.numel())].view(torch.int16).bitwise_xor_(1)

    return _gemm_kernels(flip)
