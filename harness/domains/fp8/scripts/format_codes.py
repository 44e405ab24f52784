"""The 8-bit and 4-bit formats' codes, standalone, against their bit layouts: torch's decoding of
all 256 codes of an 8-bit float format, its float32 -> e8m0 cast against the nearest power of
two, e8m0 casts against this release's golden table, and e2m1 (fp4) decode and cast against the
layout and round-to-nearest-even in exact rationals.

amp-harness writes a failed check's inputs and values over the defaults below and keeps the
block it needs (``harness.domains.fp8.repro``); for fp4 it keeps the ``torchao`` block (its MX
kernels, imported where they are called). As it lies here the ``stand_in`` block casts fp4 with
torch alone.
"""

import math
from fractions import Fraction

import torch

# -- decoding --
DTYPE = torch.float8_e4m3fn  # the format under test
# the format's bit layout: exponent and mantissa bits, bias; KIND ieee: all-ones exponent is inf
# (mantissa 0) or NaN; fn (OCP): only S.1111.111 is NaN, no inf; e8m0: 2^(code - 127), 0xFF NaN
EB = 4
MB = 3
BIAS = 7
KIND = "fn"
decoded = torch.arange(256, dtype=torch.uint8).view(DTYPE).to(torch.float32).tolist()


def decode(c: int) -> float:  # reference: the value of code c from its bit layout
    if KIND == "e8m0":
        return math.nan if c == 0xFF else math.ldexp(1.0, c - BIAS)
    sign = -1.0 if c >> (EB + MB) else 1.0
    e, m = (c >> MB) & (2**EB - 1), c & (2**MB - 1)
    if KIND == "ieee" and e == 2**EB - 1:
        return sign * math.inf if m == 0 else math.nan
    if KIND == "fn" and e == 2**EB - 1 and m == 2**MB - 1:
        return math.nan
    if e == 0:  # subnormal: no implicit one, the smallest exponent
        return sign * math.ldexp(m, 1 - BIAS - MB)
    return sign * math.ldexp(2**MB + m, e - BIAS - MB)


layout = [decode(c) for c in range(256)]
differ = [
    (c, g_, r_)
    for c, (g_, r_) in enumerate(zip(decoded, layout, strict=True))
    if not (g_ == r_ or (g_ != g_ and r_ != r_))
]
for c, g_, r_ in differ[:8]:
    print(f"code {c:#04x}: torch {g_!r}, bit layout {r_!r}")
measured = len(differ)  # codes decoded unlike their bit layout
allowed = 0

# -- e8m0_inputs --
x = torch.tensor([0.3, 1.0, 1.4, 1.6, 3.0, 1e-30, 2.5e30])  # positive, none a tie between powers of two

# -- e8m0_rounding --
cast = x.to(torch.float8_e8m0fnu).view(torch.uint8).tolist()
# reference: the nearest power of two in value, as the code 127 + its exponent (no ties among x)


def nearest(v: float) -> int:
    e = math.frexp(v)[1] - 1  # 2^e <= v < 2^(e + 1), exactly
    return 127 + (e if v - math.ldexp(1.0, e) < math.ldexp(1.0, e + 1) - v else e + 1)


powers = [nearest(v) for v in x.tolist()]
wrong = [(v, g_, r_) for v, g_, r_ in zip(x.tolist(), cast, powers, strict=True) if g_ != r_]
for v, g_, r_ in wrong[:8]:
    print(f"cast of {v!r}: torch code {g_}, nearest power of two code {r_}")
measured = len(wrong)  # values not cast to their nearest power of two
allowed = 0

# -- e8m0_outcomes --
# reference: the code each value cast to when this release's golden table was stored
CASES = [("one", 1.0, 127), ("two", 2.0, 128)]
DEVICE = "cpu"
measured = 0
for name, value, expected in CASES:
    code = torch.tensor([value], dtype=torch.float32, device=DEVICE).to(torch.float8_e8m0fnu).view(torch.uint8).item()
    print(
        f"e8m0 cast of {name} ({value!r}): code {code}; golden {expected}"
        + ("" if code == expected else "   <- differs")
    )
    measured += code != expected  # casts unlike the golden table's
allowed = 0

# -- fp4_inputs --
x = torch.tensor([0.0, -0.0, 0.25, 0.75, 1.25, 2.5, 3.5, 5.0, 7.0, -1e9, 0.3])

# -- torchao --


def to_f32(codes: torch.Tensor) -> torch.Tensor:  # torchao's e2m1 decode
    from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32

    got: torch.Tensor = f4_unpacked_to_f32(codes)
    return got


def to_f4(x: torch.Tensor) -> torch.Tensor:  # torchao's float32 -> e2m1 cast
    from torchao.prototype.mx_formats.kernels import f32_to_f4_unpacked

    got: torch.Tensor = f32_to_f4_unpacked(x)
    return got


# -- stand_in --
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # the magnitudes of codes 0..7


def to_f32(codes: torch.Tensor) -> torch.Tensor:  # type: ignore[no-redef]  # noqa: F811
    magnitude = E2M1[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def to_f4(x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-redef]  # noqa: F811
    distance = (x.double().abs().clamp(max=6.0).unsqueeze(-1) - E2M1.double()).abs()
    tie_to_even = distance + (torch.arange(8) & 1) * 1e-9  # between two equally near codes, the even one
    sign = torch.where(torch.signbit(x), 8, 0)
    return (tie_to_even.argmin(-1) | sign).to(torch.uint8)


# -- fp4 --
# reference: e2m1's bit layout (sign, 2 exponent bits with bias 1, 1 mantissa bit; exponent 0 subnormal)


def e2m1(c: int) -> float:
    e, m = (c >> 1) & 3, c & 1
    magnitude = m / 2 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -magnitude if c & 8 else magnitude


def nearest_even(v: float) -> int:  # the nearest code in exact rationals, ties to the even code; beyond 6: 6
    sign = 8 if v < 0 or (v == 0 and math.copysign(1.0, v) < 0) else 0
    best = min(range(8), key=lambda c: (abs(Fraction(abs(v)) - Fraction(e2m1(c))), c & 1))
    return sign | best


values = to_f32(torch.arange(16, dtype=torch.uint8)).tolist()
bad_decode = [(c, g) for c, g in zip(range(16), values, strict=True) if g != e2m1(c)]
codes = to_f4(x).tolist()
bad_round = [(v, g, nearest_even(v)) for v, g in zip(x.tolist(), codes, strict=True) if g != nearest_even(v)]
for c, g in bad_decode[:8]:
    print(f"code {c:#x} decodes to {g!r}; its bit layout says {e2m1(c)!r}")
for v, g, r in bad_round[:8]:
    print(f"{v!r} cast to code {g:#x} ({e2m1(g)!r}); nearest-even is {r:#x} ({e2m1(r)!r})")
measured = len(bad_decode) + len(bad_round)  # codes decoded and values cast unlike the format says
allowed = 0
