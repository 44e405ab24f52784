"""Scaled low-precision formats as executable specifications: fp8 scales, e8m0 and MX block scales.

fp8 training multiplies a tensor by a scale before the cast, so that its largest magnitude (amax)
lands at the format's maximum. What the scale must be is a short formula; this module states
each formula in exact rational arithmetic, independently of torch and torchao, so a suite can check
an implementation bit for bit. Pure: no pytest, no files, no torch.

Where an implementation computes a formula in float32 (``log2`` then ``floor``), it can differ from
the exact value next to a power of two. :func:`log2_window` bounds where; the suites register such
differences as findings and require exactness everywhere else.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from harness.numerics.formats import FP32, FloatFormat

#: torchao's floor on amax (``torchao.float8.float8_utils.EPS``): an all-zero tensor gets the finite
#: scale ``fp8_max / EPS`` instead of a division by zero.
AMAX_EPS = 1e-12


class Granularity(Enum):
    """Which elements share one scale."""

    TENSOR = "tensorwise"
    #: one scale per slice along ``CastSpec.axis``: per row for axis -1 of a 2-D tensor
    AXIS = "axiswise"


@dataclass(frozen=True)
class CastSpec:
    """How one operand of a float8 matmul is scaled and cast."""

    fmt: FloatFormat
    granularity: Granularity = Granularity.TENSOR
    #: the axis reduced to find each amax (axiswise): -1 gives one scale per row, 0 one per column
    axis: int = -1
    #: round the scale down to a power of two (then scaling by it is exact)
    power_of_2: bool = False

    def describe(self) -> str:
        where = "tensor" if self.granularity is Granularity.TENSOR else f"axis {self.axis}"
        return f"{self.fmt.short}, one scale per {where}{', power of 2' if self.power_of_2 else ''}"


# -- amax and the scale ----------------------------------------------------------------------------
def amax(values: Sequence[float]) -> float:
    """max |x| over ``values``; NaN when any is NaN (as ``torch.max`` propagates it)."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max((abs(v) for v in values), default=0.0)


def pow2_floor(x: float) -> float:
    """The largest power of two <= x, exactly (x > 0 and finite)."""
    return math.ldexp(1.0, math.frexp(x)[1] - 1)


def scale_of_amax(a: float, fmt: FloatFormat, power_of_2: bool = False) -> float:
    """The float32 scale for a tensor whose amax is ``a``: fmt.max / max(a, EPS), correctly rounded
    to float32, then rounded down to a power of two when asked.

    Rounded once: torchao divides in float64 and rounds to float32, and rounding a correctly rounded
    float64 quotient again to float32 equals rounding the exact quotient once (53 >= 2 x 24 + 2:
    double rounding of a division is innocuous then, Figueroa 1995). An inf amax gives 0; NaN gives NaN.
    """
    if math.isnan(a):
        return math.nan
    if math.isinf(a):
        return 0.0
    q = Fraction(fmt.max) / Fraction(max(a, AMAX_EPS))
    r = FP32.round_ratio(q.numerator, q.denominator)
    scale = math.inf if r.bits is None else FP32.decode(r.bits)
    return pow2_floor(scale) if power_of_2 and 0.0 < scale < math.inf else scale


def scales(rows: Sequence[Sequence[float]], spec: CastSpec) -> list[float]:
    """The scales of a 2-D tensor given as rows: one (tensorwise), one per row (axis -1) or one per
    column (axis 0)."""
    if spec.granularity is Granularity.TENSOR:
        groups: list[list[float]] = [[v for row in rows for v in row]]
    elif spec.axis in (-1, 1):
        groups = [list(row) for row in rows]
    elif spec.axis == 0:
        groups = [list(col) for col in zip(*rows, strict=True)]
    else:
        raise ValueError(f"axis must be -1, 1 or 0 for a 2-D tensor, got {spec.axis}")
    return [scale_of_amax(amax(g), spec.fmt, spec.power_of_2) for g in groups]


def quantize(x: float, scale: float, fmt: FloatFormat) -> int:
    """The fp8 bits of ``x`` scaled by ``scale``: round-to-nearest-even of the exact product,
    saturating at the format's maximum (the recipe's cast clamps before it rounds).

    torchao multiplies in float32 first; that second rounding is innocuous (24 >= 2p + 2 for these
    p <= 4), so the reference rounds the exact product once.
    """
    if math.isnan(x) or math.isnan(scale) or (math.isinf(x) and scale == 0.0):
        bits = fmt.nan_bits
        if bits is None:
            raise ValueError(f"{fmt.name} has no NaN")
        return bits
    negative = (math.copysign(1.0, x) < 0) != (math.copysign(1.0, scale) < 0)
    sign = fmt.sign_bit if negative else 0
    if math.isinf(x) or math.isinf(scale):
        return sign | fmt.max_finite_bits
    p = Fraction(abs(x)) * Fraction(abs(scale))
    r = fmt.round_ratio(p.numerator, p.denominator, negative=negative)
    return sign | fmt.max_finite_bits if r.bits is None or r.overflow else r.bits


def log2_window(k: int) -> float:
    """Half-width, in log2 units, of the band around the integer ``k`` where a float32 ``log2`` can
    land exactly on ``k``: two float32 ulps at ``k`` (the rounding of the result, plus one ulp of
    error a vectorised log2 is allowed). Outside it, ``floor(log2(x))`` and ``ceil(log2(x))`` in
    float32 are exact."""
    magnitude = max(abs(k), 1)
    return 2.0 * math.ldexp(1.0, math.frexp(magnitude)[1] - 1 - FP32.mantissa_bits)


def near_power_of_2(x: float) -> bool:
    """Whether x > 0 lies within :func:`log2_window` of a power of two (where float32 log2-based
    rounding may go the other way)."""
    lg = math.log2(x)
    k = round(lg)
    return abs(lg - k) <= log2_window(k) + 4 * math.ulp(lg)


# -- e8m0: the MX scale format ---------------------------------------------------------------------
E8M0_BIAS = 127
E8M0_NAN = 0xFF


def e8m0_decode(code: int) -> float:
    """Value of an e8m0 code: 2^(code - 127); 0xFF is NaN. No sign, no zero, no mantissa."""
    if not 0 <= code <= 0xFF:
        raise ValueError(f"{code:#x} is not an 8-bit e8m0 code")
    return math.nan if code == E8M0_NAN else math.ldexp(1.0, code - E8M0_BIAS)


def e8m0_nearest(x: float) -> tuple[int, ...]:
    """The e8m0 codes nearest to x in value (two at an exact tie), for 2^-127 <= x <= 2^127."""
    if not (math.ldexp(1.0, -E8M0_BIAS) <= x <= math.ldexp(1.0, E8M0_BIAS)):
        raise ValueError(f"{x!r} is outside e8m0's range [2^-127, 2^127]")
    e = math.frexp(x)[1] - 1  # 2^e <= x < 2^(e+1)
    lo, hi = Fraction(2) ** e, Fraction(2) ** (e + 1)
    below, above = Fraction(x) - lo, hi - Fraction(x)
    code = e + E8M0_BIAS
    if below == 0:
        return (code,)
    if below < above:
        return (code,)
    if above < below:
        return (code + 1,)
    return (code, code + 1)


# -- MX block scales --------------------------------------------------------------------------------
class MxScaleMode(Enum):
    """torchao's ways to pick a block's shared e8m0 scale (``ScaleCalculationMode``)."""

    #: OCP MX 1.0: X = 2^(floor(log2 amax) - emax_elem)
    FLOOR = "floor"
    #: X = 2^(ceil(log2 amax) - emax_elem): no element overflows, small ones may flush
    CEIL = "ceil"
    #: cuBLAS's: X = 2^ceil(log2(amax / elem_max)) (the smallest power of two that fits the block)
    RCEIL = "rceil"


def emax(fmt: FloatFormat) -> int:
    """Exponent of the element format's largest power of two (e4m3: 8, e5m2: 15, e2m1: 2)."""
    return math.frexp(fmt.max)[1] - 1


def mx_scale_code(block_amax: float, elem: FloatFormat, mode: MxScaleMode) -> int:
    """The e8m0 code of a block's scale, for a finite block amax (zero included).

    Exponents below the format's range clamp to code 0 (2^-127); above it, FLOOR and CEIL clamp to
    255 and RCEIL to 254 (torchao's ranges; 255 is also e8m0's NaN).
    """
    if not math.isfinite(block_amax):
        raise ValueError("the reference defines MX scales of finite blocks only; inf/NaN blocks are observed")
    if block_amax == 0.0:
        return 0
    if mode is MxScaleMode.RCEIL:
        ratio = Fraction(block_amax) / Fraction(elem.max)
        e = _ceil_log2(ratio)
        return min(max(e + E8M0_BIAS, 0), 254)
    floor = math.frexp(block_amax)[1] - 1
    e = floor if mode is MxScaleMode.FLOOR else floor if block_amax == math.ldexp(1.0, floor) else floor + 1
    return min(max(e - emax(elem) + E8M0_BIAS, 0), 255)


def _ceil_log2(q: Fraction) -> int:
    """ceil(log2 q) for a positive rational, exactly."""
    e = q.numerator.bit_length() - q.denominator.bit_length()  # 2^(e-1) < q < 2^(e+1)
    while Fraction(2) ** e < q:
        e += 1
    while e > -2000 and Fraction(2) ** (e - 1) >= q:
        e -= 1
    return e


def sqnr_db(signal_power: float, noise_power: float) -> float:
    """Signal-to-quantisation-noise ratio in dB (inf when the noise is zero)."""
    if noise_power == 0.0:
        return math.inf
    return 10.0 * math.log10(signal_power / noise_power)
