"""Broken fp32 -> low-precision casts. Each wraps torch's correct one and corrupts it the way a
real bug would; the format suite gets one through its ``cast_under_test`` fixture."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from harness.numerics.formats import FloatFormat, cast_bits, tensor_bits, torch_dtype

Cast = Callable[[Sequence[float], FloatFormat, torch.device], list[int]]


def correct(values: Sequence[float], fmt: FloatFormat, device: torch.device | str = "cpu") -> list[int]:
    """torch's own cast: what every broken cast below starts from."""
    return cast_bits(values, fmt, device)


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


BROKEN_CASTS: dict[str, Cast] = {
    "sign_flip_on_overflow": sign_flip_on_overflow,
    "truncating": truncating,
    "ties_away_from_zero": ties_away_from_zero,
    "flush_subnormals": flush_subnormals,
    "saturating": saturating,
    "via_fp16": via_fp16,
    "nan_to_zero": nan_to_zero,
}


class _FinfoWithWrongFp16Max:
    def __init__(self, real: Any) -> None:
        for k in ("max", "smallest_normal", "eps", "bits"):
            setattr(self, k, getattr(real, k))


def finfo_with_wrong_fp16_max(real: Callable[[torch.dtype], Any]) -> Callable[[torch.dtype], Any]:
    """``torch.finfo`` that reports 65536 as fp16's max (a wrong limits table)."""

    def finfo(dtype: torch.dtype) -> Any:
        f = _FinfoWithWrongFp16Max(real(dtype))
        if dtype == torch.float16:
            f.max = 65536.0  # type: ignore[attr-defined]
        return f

    return finfo


def half_flushing_subnormals(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.half`` with flush-to-zero: fp16 subnormals become zero."""

    def half(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        return torch.where(out.abs() < 2.0**-14, torch.zeros_like(out), out)

    return half


def fp16_cast_toward_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float16 cast rounds toward zero where it should round up in
    magnitude (a truncating conversion kernel); every other conversion is untouched."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype is torch.float16:
            up = (out.float().abs() > self.abs()) & (out != 0)
            out = out.clone()
            out.view(torch.int16)[up] -= 1  # one code toward zero (sign and magnitude)
        return out

    return to


class _Finfo:
    """``torch.finfo`` of one dtype with its ``max`` halved (a wrong limit table)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        return value / 2 if name == "max" else value


def finfo_fp16_max_halved(real: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.finfo`` whose float16 ``max`` is half the format's largest finite value."""

    def finfo(*args: Any) -> Any:
        info = real(*args)
        return _Finfo(info) if info.dtype == "float16" else info

    return finfo


def fp8_e4m3_cast_toward_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float8_e4m3fn cast rounds toward zero where it should round
    up in magnitude (a truncating conversion kernel); every other conversion is untouched."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype is torch.float8_e4m3fn:
            up = (real(out, torch.float32).abs() > self.abs()) & (real(out, torch.float32) != 0)
            out = out.clone()
            out.view(torch.uint8)[up] -= 1  # one code toward zero (sign and magnitude)
        return out

    return to


def fp8_overflow_to_nan(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float8 casts give NaN beyond the format's largest finite
    value, where torch saturates (e4m3fn) or gives inf (e5m2): a release changing its choice."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            beyond = self.abs() > float(torch.finfo(out.dtype).max)
            out = torch.where(beyond, real(torch.full_like(self, float("nan")), out.dtype), out)
        return out

    return to


def fp8_nan_to_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float8 casts turn NaN into zero."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            out = torch.where(self.isnan(), real(torch.zeros_like(self), out.dtype), out)
        return out

    return to
