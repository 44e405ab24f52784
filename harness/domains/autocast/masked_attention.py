"""Attention with a mask that leaves every query some keys gives finite outputs, under autocast as
in fp32.

Local attention and padded batches mask keys with an additive mask (``-inf`` where a query may not
look). Over a long sequence, a block of queries can have a whole block of keys masked while each
query still sees others: IEEE arithmetic gives every output finite, and a blocked kernel that
computes ``exp(-inf - (-inf))`` there makes NaN rows, which reach the loss, the gradients and
GradScaler's skip (the CPU flash kernel in torch 2.4.0, pytorch/pytorch#127055). Observed on
``F.scaled_dot_product_attention`` with a float mask at :data:`LENGTH` positions, under the amp
dtype's autocast and in fp32.

Reference: attention written out in float64 with the same mask (the attention checks' one
:func:`~harness.domains.autocast.nonfinite.reference`, by matmul, exp and sum;
``scaled_dot_product_attention`` is never called), finite everywhere for these masks. Each output is judged by finiteness only: the values are the op numerics suite's business.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.domains.autocast.nonfinite import reference
from harness.numerics.comparison import ClaimComparison, compare_claim

#: long enough for the CPU flash kernel's blocks: the upstream report's length, at which a block
#: of queries meets blocks of keys its sliding window masks whole
LENGTH = 640
HEADS, WIDTH = 2, 8
#: the keys a query sees back in a sliding window (itself and the 9 before it), as in the report
WINDOW = 10


def _sliding_window(n: int) -> torch.Tensor:
    full = torch.full((n, n), -math.inf)
    return torch.triu(full, diagonal=1) + torch.tril(full, diagonal=-WINDOW)


def _left_padding(n: int) -> torch.Tensor:
    """A left-padded sequence: its first half is padding, masked for every query."""
    mask = torch.zeros(n, n)
    mask[:, : n // 2] = -math.inf
    return mask


#: additive masks that leave every query at least one key
MASKS: dict[str, Callable[[int], torch.Tensor]] = {
    "sliding_window": _sliding_window,
    "left_padding": _left_padding,
}


@dataclass(frozen=True)
class MaskedRun:
    """Rows (query positions, over all heads) whose output came out non-finite where the float64
    reference is finite, in autocast and in fp32; or what raised."""

    rows: int
    autocast_bad: int
    fp32_bad: int
    error: str | None = None

    def describe(self, dtype: torch.dtype) -> str:
        if self.error is not None:
            return f"raised {self.error}"
        return (
            f"{self.autocast_bad} of {self.rows} rows non-finite under {dtype} autocast, {self.fp32_bad} in fp32 "
            "(float64 arithmetic: none)"
        )


def run(mask_kind: str, device: torch.device, dtype: torch.dtype) -> MaskedRun:
    """Attention with mask ``mask_kind`` under ``dtype`` autocast and in fp32, against the float64 reference."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, LENGTH, WIDTH, generator=g).to(device) for _ in range(3))
    mask = MASKS[mask_kind](LENGTH).to(device)
    finite = reference(q, k, v, mask=mask).isfinite().all(-1)
    try:
        with torch.autocast(device.type, dtype=dtype):
            lowp = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    except RuntimeError as exc:  # a kernel that refuses the mask is the verdict
        return MaskedRun(LENGTH * HEADS, 0, 0, (str(exc).strip().splitlines() or [type(exc).__name__])[0])

    def bad(out: torch.Tensor) -> int:
        return int((finite & ~out.isfinite().all(-1)).sum())

    return MaskedRun(LENGTH * HEADS, bad(lowp), bad(full))


def claim(mask_kind: str, dtype: torch.dtype, seen: MaskedRun) -> ClaimComparison:
    """No row the float64 reference keeps finite comes out non-finite; nothing raised."""
    wrong = seen.autocast_bad + seen.fp32_bad + (seen.error is not None)
    return compare_claim(
        f"attention_mask.{mask_kind}.rows_non_finite",
        wrong,
        wrong == 0,
        "attention with a mask that leaves every query some keys gives finite outputs, as float64 arithmetic does",
        detail=f"scaled_dot_product_attention, {mask_kind} mask over {LENGTH} positions: {seen.describe(dtype)}",
        expected=0,
        allowance=0,
        unit="rows",
    )


def issue_present(device: torch.device) -> tuple[bool, str]:
    """The registry's observation: does the sliding window give non-finite rows in fp32?"""
    seen = run("sliding_window", device, torch.bfloat16)
    return seen.error is None and seen.fp32_bad > 0, seen.describe(torch.bfloat16)
