"""Bit-level reference models of the floating-point formats used in mixed precision.

Everything here is derived from the bit layout with integer arithmetic, independently of
``torch.finfo`` and of any hardware cast, so that the format suite can check torch against it.
Pure: no pytest, no file system. torch is imported only by the helpers that read tensor bits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class Encoding(Enum):
    """How the all-ones exponent field is used."""

    #: IEEE 754: all-ones exponent encodes inf (mantissa 0) and NaN (mantissa != 0).
    IEEE = "ieee"
    #: "fn" formats (OCP FP8 E4M3): finite only; only the all-ones pattern is NaN.
    FINITE_NAN_ONLY = "fn"
    #: OCP MX element formats (FP4 E2M1): every pattern is a finite number, no inf and no NaN.
    FINITE = "finite"


@dataclass(frozen=True)
class RoundResult:
    """Result of rounding a real number to a format with round-to-nearest-even."""

    #: Bit pattern of the rounded value, or ``None`` when the format defines no result
    #: (overflow of a format without infinities: implementations saturate or return NaN).
    bits: int | None
    overflow: bool
    is_nan: bool = False


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format given by its bit layout."""

    name: str
    short: str
    exponent_bits: int
    mantissa_bits: int
    encoding: Encoding = Encoding.IEEE

    # -- layout -----------------------------------------------------------------------------
    @property
    def total_bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return (1 << (self.exponent_bits - 1)) - 1

    @property
    def precision(self) -> int:
        """Significand bits including the implicit leading one (p)."""
        return self.mantissa_bits + 1

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def _exp_all_ones(self) -> int:
        return (1 << self.exponent_bits) - 1

    @property
    def _mant_mask(self) -> int:
        return (1 << self.mantissa_bits) - 1

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exponent_bits + self.mantissa_bits)

    @property
    def max_finite_bits(self) -> int:
        if self.encoding is Encoding.IEEE:
            return ((self._exp_all_ones - 1) << self.mantissa_bits) | self._mant_mask
        if self.encoding is Encoding.FINITE:
            return (self._exp_all_ones << self.mantissa_bits) | self._mant_mask
        return (self._exp_all_ones << self.mantissa_bits) | (self._mant_mask - 1)

    @property
    def inf_bits(self) -> int | None:
        if self.encoding is Encoding.IEEE:
            return self._exp_all_ones << self.mantissa_bits
        return None

    @property
    def nan_bits(self) -> int | None:
        """The canonical NaN pattern; None for a format without NaN (FP4 E2M1)."""
        if self.encoding is Encoding.FINITE:
            return None
        if self.encoding is Encoding.IEEE:
            return (self._exp_all_ones << self.mantissa_bits) | (1 << (self.mantissa_bits - 1))
        return (self._exp_all_ones << self.mantissa_bits) | self._mant_mask

    @property
    def one_bits(self) -> int:
        return self.bias << self.mantissa_bits

    # -- decoding ---------------------------------------------------------------------------
    def decode(self, bits: int) -> float:
        """Exact value of a bit pattern (all these formats fit exactly in a Python float)."""
        if not 0 <= bits < (1 << self.total_bits):
            raise ValueError(f"{bits:#x} is not a {self.total_bits}-bit pattern of {self.name}")
        sign = -1.0 if bits & self.sign_bit else 1.0
        exp = (bits >> self.mantissa_bits) & self._exp_all_ones
        mant = bits & self._mant_mask
        if exp == self._exp_all_ones:
            if self.encoding is Encoding.IEEE:
                return sign * math.inf if mant == 0 else math.nan
            if self.encoding is Encoding.FINITE_NAN_ONLY and mant == self._mant_mask:
                return math.nan
        if exp == 0:
            return sign * math.ldexp(mant, self.emin - self.mantissa_bits)
        return sign * math.ldexp((1 << self.mantissa_bits) | mant, exp - self.bias - self.mantissa_bits)

    def is_nan_bits(self, bits: int) -> bool:
        return math.isnan(self.decode(bits))

    # -- derived limits (from the layout, not from torch.finfo) ------------------------------
    @property
    def max(self) -> float:
        return self.decode(self.max_finite_bits)

    @property
    def smallest_normal(self) -> float:
        return self.decode(1 << self.mantissa_bits)

    @property
    def smallest_subnormal(self) -> float:
        return self.decode(1)

    @property
    def eps(self) -> float:
        """Distance from 1 to the next larger representable number."""
        return self.decode(self.one_bits + 1) - 1.0

    @property
    def unit_roundoff(self) -> float:
        """u = eps / 2 = 2^-p: the largest relative error of one round-to-nearest."""
        return self.eps / 2

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits carried: p * log10(2)."""
        return self.precision * math.log10(2)

    @property
    def overflow_threshold(self) -> float:
        """Smallest magnitude that rounds past the maximum: max + half an ulp of max.

        Round-to-nearest-even with an unbounded exponent maps this tie up (the maximum's
        significand is odd), so on an IEEE format it and everything above becomes inf.
        """
        ulp_of_max = math.ldexp(1.0, math.frexp(self.max)[1] - 1 - self.mantissa_bits)
        return self.max + ulp_of_max / 2

    def limits(self) -> dict[str, float]:
        return {
            "max": self.max,
            "smallest_normal": self.smallest_normal,
            "smallest_subnormal": self.smallest_subnormal,
            "eps": self.eps,
            "unit_roundoff": self.unit_roundoff,
        }

    # -- reference rounding -------------------------------------------------------------------
    def round_bits(self, x: float) -> RoundResult:
        """Round the exact value of ``x`` to this format, round-to-nearest, ties-to-even."""
        if math.isnan(x):
            return RoundResult(self.nan_bits, overflow=False, is_nan=True)
        negative = math.copysign(1.0, x) < 0
        if math.isinf(x):
            inf = self.inf_bits
            sign = self.sign_bit if negative else 0
            return RoundResult(None if inf is None else sign | inf, overflow=True)
        num, den = abs(x).as_integer_ratio()
        return self.round_ratio(num, den, negative=negative)

    def round_ratio(self, num: int, den: int, *, negative: bool = False) -> RoundResult:
        """Round the exact rational ``num/den`` (both >= 0, den > 0) to this format, ties-to-even.

        Exact integer arithmetic, so a quotient such as ``fp8_max / amax`` is rounded once, as a
        correctly rounded division would round it (the fp8 scale references need this).
        """
        if num < 0 or den <= 0:
            raise ValueError(f"round_ratio needs num >= 0 and den > 0, got {num}/{den}")
        sign = self.sign_bit if negative else 0
        if num == 0:
            return RoundResult(sign, overflow=False)
        binade = num.bit_length() - den.bit_length()  # floor(log2(num/den)) is binade or binade - 1
        if (num << max(0, -binade)) < (den << max(0, binade)):
            binade -= 1
        quantum_exp = max(binade, self.emin) - self.mantissa_bits
        n, d = (num, den << quantum_exp) if quantum_exp >= 0 else (num << -quantum_exp, den)
        q, rem = divmod(n, d)
        if 2 * rem > d or (2 * rem == d and q & 1):
            q += 1
        if q < (1 << self.mantissa_bits):  # subnormal (or zero after underflow)
            return RoundResult(sign | q, overflow=False)
        if q == (1 << (self.mantissa_bits + 1)):  # rounded up into the next binade
            q >>= 1
            quantum_exp += 1
        magnitude = ((quantum_exp + self.mantissa_bits + self.bias) << self.mantissa_bits) | (q & self._mant_mask)
        if magnitude > self.max_finite_bits:
            inf = self.inf_bits
            return RoundResult(None if inf is None else sign | inf, overflow=True)
        return RoundResult(sign | magnitude, overflow=False)

    def round(self, x: float) -> float:
        """Reference value of ``x`` rounded to this format (NaN where the format defines none)."""
        r = self.round_bits(x)
        return math.nan if r.bits is None else self.decode(r.bits)


FP64 = FloatFormat("float64", "fp64", 11, 52)
FP32 = FloatFormat("float32", "fp32", 8, 23)
FP16 = FloatFormat("float16", "fp16", 5, 10)
BF16 = FloatFormat("bfloat16", "bf16", 8, 7)
FP8_E4M3FN = FloatFormat("float8_e4m3fn", "e4m3fn", 4, 3, Encoding.FINITE_NAN_ONLY)
FP8_E5M2 = FloatFormat("float8_e5m2", "e5m2", 5, 2)
#: OCP MX FP4 element format (torch's dtype packs two per byte: ``float4_e2m1fn_x2``).
FP4_E2M1 = FloatFormat("float4_e2m1fn", "e2m1", 2, 1, Encoding.FINITE)

#: The formats of mixed-precision training, by torch dtype name.
FORMATS: dict[str, FloatFormat] = {f.name: f for f in (FP32, FP16, BF16, FP8_E4M3FN, FP8_E5M2)}
_ALIASES: dict[str, FloatFormat] = {
    **{f.name: f for f in (FP64, *FORMATS.values())},
    **{f.short: f for f in (FP64, *FORMATS.values())},
    "half": FP16,
    "float": FP32,
    "double": FP64,
}


def format_of(dtype: Any) -> FloatFormat:
    """The reference format for a torch dtype, a dtype name ('bfloat16') or a short name ('bf16')."""
    if isinstance(dtype, FloatFormat):
        return dtype
    name = str(dtype).removeprefix("torch.")
    try:
        return _ALIASES[name]
    except KeyError:
        known = ", ".join(sorted(_ALIASES))
        raise ValueError(f"unknown floating-point format {dtype!r}; known: {known}") from None


def is_fp32_exact(x: float) -> bool:
    """Whether ``x`` is exactly representable in float32 (the inputs of the cast properties)."""
    r = FP32.round_bits(x)
    return r.is_nan or (r.bits is not None and FP32.decode(r.bits) == x)


# -- torch helpers ----------------------------------------------------------------------------
_INT_VIEW = {8: "uint8", 16: "int16", 32: "int32", 64: "int64"}


def tensor_bits(t: torch.Tensor) -> list[int]:
    """Raw bit patterns of a floating tensor, as unsigned integers."""
    import torch

    fmt = format_of(t.dtype)
    view_dtype = getattr(torch, _INT_VIEW[fmt.total_bits])
    mask = (1 << fmt.total_bits) - 1
    return [int(v) & mask for v in t.detach().cpu().contiguous().view(view_dtype).flatten().tolist()]


def cast_bits(values: Sequence[float], fmt: FloatFormat, device: torch.device | str = "cpu") -> list[int]:
    """fp32 ``values`` cast by torch to ``fmt`` on ``device``: the raw bit patterns of the result."""
    import torch

    src = torch.tensor(list(values), dtype=torch.float32, device=device)
    return tensor_bits(src.to(torch_dtype(fmt)))


def torch_dtype(fmt: FloatFormat | str) -> torch.dtype:
    import torch

    dtype = getattr(torch, format_of(fmt).name)
    assert isinstance(dtype, torch.dtype)
    return dtype


def finite_magnitudes(fmt: FloatFormat) -> list[float]:
    """Every finite magnitude of a format narrow enough to enumerate (8 bits or fewer), ascending."""
    values = {abs(fmt.decode(c)) for c in range(1 << fmt.total_bits)}
    return sorted(v for v in values if math.isfinite(v))


def rounding_probes(fmt: FloatFormat) -> list[float]:
    """Every finite value of ``fmt``, every midpoint between neighbours, the fp32 values just
    below and above each midpoint; both signs. All are fp32-exact (fp8 midpoints need 5 bits)."""
    mags = finite_magnitudes(fmt)
    out: list[float] = []
    for lo, hi in itertools.pairwise(mags):
        mid = (lo + hi) / 2
        below = FP32.decode(FP32.round_bits(mid).bits - 1)  # type: ignore[operator]
        above = FP32.decode(FP32.round_bits(mid).bits + 1)  # type: ignore[operator]
        out += [lo, below, mid, above]
    out.append(mags[-1])
    return out + [-v for v in out if v != 0.0] + [-0.0]
