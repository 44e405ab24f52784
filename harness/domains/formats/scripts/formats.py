"""The formats' claims, standalone: torch's casts against IEEE round-to-nearest-even in exact
rationals, ``torch.finfo``'s limits against the format's bit layout, torch expressions against
the exact values expected of them, and fp8 casts against their expected outcomes.

amp-harness writes a failed check's values over the defaults below and keeps the block it needs
(``harness.domains.formats.repro``); as it lies here each judgement runs on bf16 and the OCP
e4m3 format.
"""

import math
from collections.abc import Callable
from fractions import Fraction

import torch

# -- inputs --
x = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -3.0e38, 1e-40, 0.1, 2.0**-133])  # ties, overflow, subnormals

# -- cast_rounding --
DTYPE = torch.bfloat16  # the format cast to
# reference: IEEE round-to-nearest-even, exactly (Python integers and fractions), from the format
P = 8  # significand bits
EMIN = -126  # the smallest exponent of a normal value
MAX = 3.3895313892515355e38  # the largest finite value
IEEE = True  # beyond MAX: inf (IEEE 754); else NaN (no inf in the format)
got = x.to(DTYPE).float().tolist()


def rne(v: float) -> float:
    if v != v or v in (0.0, math.inf, -math.inf):
        return v
    a = Fraction(abs(v))
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2 a), or one more
    if Fraction(2) ** e > a:
        e -= 1
    q = Fraction(2) ** (max(e, EMIN) - (P - 1))  # the spacing of the format's values near a
    k, r = divmod(a, q)
    k = int(k) + (1 if r > q / 2 or (r == q / 2 and int(k) % 2 == 1) else 0)
    out = float(k * q)
    if out > MAX:
        out = math.inf if IEEE else math.nan
    return math.copysign(out, v)


ref = [rne(v) for v in x.tolist()]
differ = [
    (v, g_, r_)
    for v, g_, r_ in zip(x.tolist(), got, ref, strict=True)
    if not (g_ == r_ and math.copysign(1, g_) == math.copysign(1, r_)) and not (g_ != g_ and r_ != r_)
]
for v, g_, r_ in differ[:8]:
    print(f"cast of {v!r}: torch {g_!r}, round-to-nearest-even {r_!r}")
measured = len(differ)  # values cast otherwise than round-to-nearest-even
allowed = 0

# -- format_limits --
DTYPE = torch.float8_e4m3fn  # the format
# reference: the bit layout (exponent and mantissa widths, bias 2^(E-1) - 1); IEEE: the all-ones
# exponent is inf and NaN (IEEE 754); else only the all-ones pattern is NaN (OCP)
EB = 4
MB = 3
IEEE = False
NAMES = ["max", "smallest_normal", "smallest_subnormal", "eps", "unit_roundoff"]  # the limits judged
fi = torch.finfo(DTYPE)
E = round(math.log2(math.log2(float(fi.max)))) + 1  # exponent width, from finfo alone as the check does
limits = {
    "max": float(fi.max),
    "smallest_normal": float(fi.smallest_normal),
    "smallest_subnormal": float(fi.smallest_normal) * 2.0 ** -(fi.bits - 1 - E),
    "eps": float(fi.eps),
    "unit_roundoff": float(fi.eps) / 2,
}
BIAS = 2 ** (EB - 1) - 1
EMAX = 2**EB - (2 if IEEE else 1) - BIAS  # the largest exponent of a finite value
TOP = 2 - 2.0 ** -(MB if IEEE else MB - 1)  # its largest significand (OCP: all-ones mantissa there is NaN)
layout = {
    "max": TOP * 2.0**EMAX,
    "smallest_normal": 2.0 ** (1 - BIAS),
    "smallest_subnormal": 2.0 ** (1 - BIAS - MB),
    "eps": 2.0**-MB,
    "unit_roundoff": 2.0 ** -(MB + 1),
}
wrong = [k for k in NAMES if limits[k] != layout[k]]
for k in wrong:
    print(f"{DTYPE} {k}: torch.finfo gives {limits[k]!r}, the bit layout {layout[k]!r}")
measured = len(wrong)  # limits unlike the bit layout
allowed = 0

# -- torch_values --
# reference: the values the check expected, exactly
CASES: list[tuple[str, Callable[[], object], float]] = [
    ("bf16 eps", lambda: torch.finfo(torch.bfloat16).eps, 2.0**-7),
]
measured = 0
for name, value, expected in CASES:
    seen = float(value())  # type: ignore[arg-type]
    print(f"{name}: {seen!r}; expected {expected!r}" + ("" if seen == expected else "   <- differs"))
    measured += seen != expected  # values unlike the expected ones
allowed = 0

# -- cast_outcomes --


def describe(v: float, fmax: float) -> str:
    if v != v:
        return "nan"
    if v in (math.inf, -math.inf):
        return "inf" if v > 0 else "-inf"
    if abs(v) == fmax:
        return "max" if v > 0 else "-max"
    return repr(v)


# reference: what the check expected of each cast (the golden table of this release, or the rule)
OUTCOMES = [("float8_e5m2", 1.0, "1.0"), ("float8_e4m3fn", 448.0, "max")]
DEVICE = "cpu"
measured = 0
for name, value_in, expected_out in OUTCOMES:
    dtype = getattr(torch, name)
    out = torch.tensor([value_in], dtype=torch.float32, device=DEVICE).to(dtype).float().item()
    seen_as = describe(out, float(torch.finfo(dtype).max))
    print(
        f"{name} cast of {value_in!r}: {seen_as}; expected {expected_out}"
        + ("" if seen_as == expected_out else "   <- differs")
    )
    measured += seen_as != expected_out  # casts unlike the expected ones
allowed = 0
