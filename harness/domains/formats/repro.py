"""The formats family's reproductions: torch's casts against round-to-nearest-even in exact
rationals, a format's limits from its bits, and torch's values against their sources."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.domains.repro import FailureRepro, dtype_src, float_src
from harness.numerics.formats import format_of


def cast_rounding(what: str, values: torch.Tensor, dtype: torch.dtype) -> FailureRepro:
    """torch's cast of float32 ``values`` to ``dtype`` against round-to-nearest-even written out in
    exact rationals from the format's precision, minimum exponent and largest finite value (values
    the format leaves to the implementation, overflow without inf, are not among them)."""
    fmt = format_of(dtype)
    ieee = fmt.encoding.value == "ieee"
    code = f"""from fractions import Fraction

got = x.to({dtype_src(dtype)}).float().tolist()
# reference: IEEE round-to-nearest-even, exactly (Python integers and fractions), from the format
P, EMIN, MAX = {fmt.precision}, {fmt.emin}, {fmt.max!r}  # {fmt.name}: significand bits, min exponent, max finite


def rne(v):
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
        out = {"math.inf" if ieee else "math.nan"}  # {"beyond the largest finite value: inf" if ieee else "no inf in this format"}
    return math.copysign(out, v)


ref = [rne(v) for v in x.tolist()]
differ = [
    (v, g_, r_)
    for v, g_, r_ in zip(x.tolist(), got, ref)
    if not (g_ == r_ and math.copysign(1, g_) == math.copysign(1, r_)) and not (g_ != g_ and r_ != r_)
]
for v, g_, r_ in differ[:8]:
    print(f"cast of {{v!r}}: torch {{g_!r}}, round-to-nearest-even {{r_!r}}")
measured = len(differ)  # values cast otherwise than round-to-nearest-even
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: IEEE 754 round-to-nearest-even", {"x": values})


def format_limits(what: str, fmt_name: str, names: Sequence[str]) -> FailureRepro:
    """``torch.finfo``'s limits of a format against the same limits computed from its bit layout
    (exponent and mantissa widths, bias, and which all-ones patterns are not finite)."""
    fmt = format_of(fmt_name)
    ieee = fmt.encoding.value == "ieee"
    code = f"""fi = torch.finfo(torch.{fmt.name})
E = round(math.log2(math.log2(float(fi.max)))) + 1  # exponent width, from finfo alone as the check does
got = {{
    "max": float(fi.max),
    "smallest_normal": float(fi.smallest_normal),
    "smallest_subnormal": float(fi.smallest_normal) * 2.0 ** -(fi.bits - 1 - E),
    "eps": float(fi.eps),
    "unit_roundoff": float(fi.eps) / 2,
}}
# reference: the bit layout ({fmt.exponent_bits} exponent bits, {fmt.mantissa_bits} mantissa bits, bias 2^(E-1) - 1); {
        "the all-ones exponent is inf and NaN (IEEE 754)" if ieee else "only the all-ones pattern is NaN (OCP)"
    }
EB, MB = {fmt.exponent_bits}, {fmt.mantissa_bits}
BIAS = 2 ** (EB - 1) - 1
EMAX = 2**EB - {2 if ieee else 1} - BIAS  # the largest exponent of a finite value
TOP = 2 - 2.0 ** -{"MB" if ieee else "(MB - 1)"}  # its largest significand{
        "" if ieee else " (all-ones mantissa there is NaN)"
    }
ref = {{
    "max": TOP * 2.0**EMAX,
    "smallest_normal": 2.0 ** (1 - BIAS),
    "smallest_subnormal": 2.0 ** (1 - BIAS - MB),
    "eps": 2.0**-MB,
    "unit_roundoff": 2.0 ** -(MB + 1),
}}
differ = [k for k in {list(names)!r} if got[k] != ref[k]]
for k in differ:
    print(f"{fmt.name} {{k}}: torch.finfo gives {{got[k]!r}}, the bit layout {{ref[k]!r}}")
measured = len(differ)  # limits unlike the bit layout
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: a format's limits follow from its bit layout")


def torch_values(what: str, cases: Sequence[tuple[str, str, float]], origin: str) -> FailureRepro:
    """torch expressions (source text) against the exact values a check expected of them."""
    rows = "\n".join(f"    ({name!r}, lambda: {src}, {float_src(expected)})," for name, src, expected in cases)
    code = f"""# reference: the values the check expected, exactly
CASES = [
{rows}
]
measured = 0
for name, value, expected in CASES:
    got = float(value())
    print(f"{{name}}: {{got!r}}; expected {{expected!r}}" + ("" if got == expected else "   <- differs"))
    measured += got != expected  # values unlike the expected ones
allowed = 0"""
    return FailureRepro("formats", what, code, origin)


def cast_outcomes(what: str, cases: Sequence[tuple[str, float, str]], device: str = "cpu") -> FailureRepro:
    """torch's cast of float32 values to fp8 formats, each result described as the check describes
    it (``max``, ``-max``, ``inf``, ``nan`` or the value), against the expected description."""
    rows = "\n".join(f"    ({name!r}, {float_src(x)}, {exp!r})," for name, x, exp in cases)
    code = f"""def describe(v, fmax):
    if v != v:
        return "nan"
    if v in (math.inf, -math.inf):
        return "inf" if v > 0 else "-inf"
    if abs(v) == fmax:
        return "max" if v > 0 else "-max"
    return repr(v)


# reference: what the check expected of each cast (the golden table of this release, or the rule)
CASES = [
{rows}
]
measured = 0
for name, x, expected in CASES:
    dtype = getattr(torch, name)
    got = torch.tensor([x], dtype=torch.float32, device={device!r}).to(dtype).float().item()
    seen = describe(got, float(torch.finfo(dtype).max))
    print(f"{{name}} cast of {{x!r}}: {{seen}}; expected {{expected}}" + ("" if seen == expected else "   <- differs"))
    measured += seen != expected  # casts unlike the expected ones
allowed = 0"""
    return FailureRepro("formats", what, code, "exact", device=device)
