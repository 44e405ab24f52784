"""Deliberately wrong implementations: each must make some check of the suites fail.

Each broken cast wraps torch's correct one and corrupts it the way a real bug would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from harness.formats import FloatFormat, tensor_bits, torch_dtype


def correct(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    return tensor_bits(torch.tensor(list(values), dtype=torch.float32, device=device).to(torch_dtype(fmt)))


def truncating(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Round toward zero instead of to nearest (a cast that drops the low mantissa bits)."""
    out = []
    for x, b in zip(values, correct(values, fmt, device), strict=True):
        got = fmt.decode(b)
        if math.isfinite(x) and (abs(got) > abs(x)) and (b & ~fmt.sign_bit) != 0:
            b -= 1  # one step toward zero (same sign)
        out.append(b)
    return out


def ties_away_from_zero(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Round half away from zero (C's round()) instead of half to even."""
    out = []
    for x, b in zip(values, correct(values, fmt, device), strict=True):
        got = fmt.decode(b)
        if math.isfinite(got) and math.isfinite(x) and abs(got) < abs(x):
            up = fmt.decode(b + 1)
            if abs(up) - abs(x) == abs(x) - abs(got):  # an exact tie that went to even, downward
                b += 1
        out.append(b)
    return out


def flush_subnormals(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Flush-to-zero: subnormal results become signed zero (a DAZ/FTZ mode left on)."""
    mant_exp_mask = ~fmt.sign_bit & ((1 << fmt.total_bits) - 1)
    return [
        b & fmt.sign_bit if 0 < (b & mant_exp_mask) < (1 << fmt.mantissa_bits) else b
        for b in correct(values, fmt, device)
    ]


def saturating(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Clamp to +-max before casting: overflow gives max instead of inf."""
    clamped = [x if math.isnan(x) else max(-fmt.max, min(fmt.max, x)) for x in values]
    return correct(clamped, fmt, device)


def via_fp16(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Double rounding: fp32 -> fp16 -> target (wrong for bf16, whose range fp16 cannot hold)."""
    t = torch.tensor(list(values), dtype=torch.float32, device=device).half()
    return tensor_bits(t.to(torch_dtype(fmt)))


def nan_to_zero(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """A cast that sanitises NaN to zero (torch.nan_to_num slipped into the path)."""
    return correct([0.0 if math.isnan(x) else x for x in values], fmt, device)


def sign_flip_on_overflow(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Overflow wraps to the opposite sign's maximum (an integer-style wraparound): not monotonic."""
    max_bits = fmt.max_finite_bits
    out = []
    for x, b in zip(values, correct(values, fmt, device), strict=True):
        if math.isfinite(x) and abs(x) >= fmt.overflow_threshold:
            b = max_bits if x < 0 else fmt.sign_bit | max_bits
        out.append(b)
    return out


BROKEN_CASTS = {
    "sign_flip_on_overflow": sign_flip_on_overflow,
    "truncating": truncating,
    "ties_away_from_zero": ties_away_from_zero,
    "flush_subnormals": flush_subnormals,
    "saturating": saturating,
    "via_fp16": via_fp16,
    "nan_to_zero": nan_to_zero,
}
