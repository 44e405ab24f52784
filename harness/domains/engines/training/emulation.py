"""A correctly rounded AMP recipe, emulated in float64: the reference the AMP lane judges against.

Autocast's promise for its low-precision ops (GEMMs, convolutions, attention) is: inputs rounded
to the low-precision format, products accumulated in (at least) fp32, the output rounded to the
format once; gradients flowing back through them are rounded the same way. :class:`RoundingMode`
computes exactly that in float64 arithmetic: every call of such a function on a float64 model
rounds its floating inputs and its output to the format (and, through :class:`_Round`, the
gradients of both), while everything else runs in float64. Nothing here uses a low-precision
kernel, so the reference cannot drift with the stack's AMP kernels.

Rounding is to nearest even, as autocast's casts round: the AMP lane compares one training step
of the recipe with the same step emulated, both against float64, from the same state
(:mod:`harness.domains.engines.training.amp_lane`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

#: The functions autocast runs in its low-precision dtype on every device (the GEMM-like ops of
#: ``torch/testing/_internal/autocast_test_lists.py``), as the models call them.
LOW_PRECISION_FUNCTIONS: frozenset[Callable[..., Any]] = frozenset(
    {
        F.linear,
        F.conv1d,
        F.conv2d,
        F.conv3d,
        F.conv_transpose1d,
        F.conv_transpose2d,
        F.conv_transpose3d,
        F.scaled_dot_product_attention,
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.baddbmm,
        torch.addbmm,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.Tensor.mm,
        torch.Tensor.bmm,
    }
)


def round_to(x: Any, dtype: torch.dtype) -> Any:
    """``x`` rounded to ``dtype`` (round to nearest even, as autocast's casts round) and kept in
    float64, its gradient rounded the same way; anything but a float64 tensor as it is."""
    if isinstance(x, torch.Tensor) and x.dtype == torch.float64:
        return _Round.apply(x, dtype)  # type: ignore[no-untyped-call]
    return x


class _Round(torch.autograd.Function):
    """Round in the forward pass; round the incoming gradient in the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype).to(grad.dtype), None


class RoundingMode(TorchFunctionMode):
    """Inside it, the low-precision functions of a float64 model round like correct autocast.

    Example::

        with RoundingMode(torch.bfloat16):
            loss = loss_fn(model64(x64), y)
        loss.backward()  # gradients through the rounded ops are rounded too
    """

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        #: how many low-precision calls were rounded (0: the model calls none the emulation knows)
        self.calls = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in LOW_PRECISION_FUNCTIONS:
            return func(*args, **kwargs)
        self.calls += 1
        if func is F.scaled_dot_product_attention:
            return _attention(self.dtype, *args, **kwargs)
        rounded_args = tuple(round_to(a, self.dtype) for a in args)
        rounded_kwargs = {k: round_to(v, self.dtype) for k, v in kwargs.items()}
        return round_to(func(*rounded_args, **rounded_kwargs), self.dtype)


def _attention(
    dtype: torch.dtype,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Attention as autocast computes it from its parts: the two GEMMs (scores, probabilities x
    values) take rounded inputs and give rounded outputs, the softmax runs in high precision on the
    rounded scores (PyTorch's math reference of scaled_dot_product_attention, with roundings)."""
    if dropout_p:
        raise ValueError("the AMP lane's emulation takes no attention dropout: its steps run with dropout off")
    q, k, v = (round_to(t, dtype) for t in (query, key, value))
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = round_to(torch.matmul(q, k.transpose(-2, -1)) * factor, dtype)
    length, source = q.shape[-2], k.shape[-2]
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
    probs = round_to(torch.softmax(scores, dim=-1), dtype)
    return round_to(torch.matmul(probs, v), dtype)  # type: ignore[no-any-return]


class CorrectAttention(TorchFunctionMode):
    """Inside it, ``scaled_dot_product_attention`` of an AMP forward is computed correctly rounded
    (:func:`_attention` in float64 from its low-precision inputs, the output in their dtype): the AMP
    lane judges a recipe with the attention kernel's own internal roundings taken out, and measures
    them apart (the op numerics suite holds the kernel to its error budget)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.calls += 1
        query = args[0]
        dtype = query.dtype
        if dtype not in (torch.bfloat16, torch.float16):
            return func(*args, **kwargs)
        wide: list[Any] = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        mask = kwargs.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.is_floating_point():
            kwargs["attn_mask"] = mask.double()
        return _attention(dtype, *wide, **kwargs).to(dtype)
