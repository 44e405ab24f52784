"""The fp8 family's reproductions: scales, codes, e8m0 and fp4 casts, MX and NVFP4 block bits and
stochastic rounding against their exact definitions, and scaled products against float64."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from harness.domains.fp8.blockquant import BlockConformance, BlockScaling, TorchaoBlockScaling, torch_elem_dtype
from harness.domains.repro import FailureRepro, dtype_src, float_src
from harness.numerics import blockscaled as B
from harness.numerics.formats import format_of


def fp8_scales(
    what: str, x: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float, axis: int | None, power_of_2: bool
) -> FailureRepro:
    """torchao's fp8 scales of ``x`` against their definition, fp8_max / max(amax, 1e-12) in float64
    rounded once to float32 (power of two: the largest not above it, from the bits)."""
    gran = "TENSORWISE" if axis is None else "AXISWISE"
    amax = "x.double().abs().max()" if axis is None else f"x.double().abs().amax(dim={axis}, keepdim=True)"
    pow2 = (
        "\nref = torch.tensor([math.ldexp(1.0, math.frexp(v)[1] - 1) if 0 < v < math.inf else v for v in "
        "ref.flatten().tolist()]).reshape(ref.shape)  # the power of two at or below it"
        if power_of_2
        else ""
    )
    code = f"""from torchao.float8 import config, float8_utils

got = float8_utils.tensor_to_scale(
    x, {dtype_src(fp8_dtype)}, scaling_granularity=config.ScalingGranularity.{gran},
    axiswise_dim={axis!r}, round_scales_to_power_of_2={power_of_2!r},
)
# reference: the definition, in float64 (amax of a float32 tensor is exact)
FP8_MAX = {fp8_max!r}  # the format's largest finite value
exact = FP8_MAX / torch.clamp({amax}, min=1e-12)  # inf amax: 0; NaN: NaN
ref = exact.float()  # rounded once more to float32: as rounding the exact quotient once (53 >= 2 x 24 + 2){pow2}
pairs = list(zip(got.float().flatten().tolist(), ref.flatten().tolist()))
differ = [(i, g_, r_) for i, (g_, r_) in enumerate(pairs) if g_ != r_ and not (g_ != g_ and r_ != r_)]
for i, g_, r_ in differ:
    print(f"scale {{i}}: torchao {{g_!r}}, by definition {{r_!r}}")
measured = len(differ) if got.numel() == ref.numel() else math.inf  # scales unlike their definition
allowed = 0"""
    return FailureRepro(
        "fp8", what, code, "exact: the scale is defined to one float32 rounding", {"x": x}, ("torch", "torchao")
    )


def code_decoding(what: str, dtype_name: str) -> FailureRepro:
    """torch's decoding of all 256 codes of an 8-bit float format (viewed from uint8, converted to
    float32) against the value each code's bit layout defines, written out from the layout."""
    if dtype_name == "float8_e8m0fnu":
        layout = "EB, MB, BIAS, KIND = 8, 0, 127, 'e8m0'  # exponent only: 2^(code - 127), 0xFF NaN (OCP MX)"
    else:
        fmt = format_of(dtype_name)
        kind = "ieee" if fmt.encoding.value == "ieee" else "fn"
        layout = f"EB, MB, BIAS, KIND = {fmt.exponent_bits}, {fmt.mantissa_bits}, {fmt.bias}, {kind!r}  # " + (
            "IEEE 754: all-ones exponent is inf (mantissa 0) or NaN"
            if kind == "ieee"
            else "OCP: only S.1111.111 is NaN, no inf"
        )
    code = f"""got = torch.arange(256, dtype=torch.uint8).view(torch.{dtype_name}).to(torch.float32).tolist()
# reference: the value of each code from its bit layout
{layout}


def decode(c):
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


ref = [decode(c) for c in range(256)]
differ = [(c, g_, r_) for c, (g_, r_) in enumerate(zip(got, ref)) if not (g_ == r_ or (g_ != g_ and r_ != r_))]
for c, g_, r_ in differ[:8]:
    print(f"code {{c:#04x}}: torch {{g_!r}}, bit layout {{r_!r}}")
measured = len(differ)  # codes decoded unlike their bit layout
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: a code's value follows from the format's bit layout")


def e8m0_rounding(what: str, values: torch.Tensor) -> FailureRepro:
    """torch's float32 -> e8m0 cast of positive values, none of them a tie, against the nearest
    power of two in value, found exactly (frexp and comparisons of Python floats)."""
    code = """got = x.to(torch.float8_e8m0fnu).view(torch.uint8).tolist()
# reference: the nearest power of two in value, as the code 127 + its exponent (no ties among x)


def nearest(v):
    e = math.frexp(v)[1] - 1  # 2^e <= v < 2^(e + 1), exactly
    return 127 + (e if v - math.ldexp(1.0, e) < math.ldexp(1.0, e + 1) - v else e + 1)


ref = [nearest(v) for v in x.tolist()]
differ = [(v, g_, r_) for v, g_, r_ in zip(x.tolist(), got, ref) if g_ != r_]
for v, g_, r_ in differ[:8]:
    print(f"cast of {v!r}: torch code {g_}, nearest power of two code {r_}")
measured = len(differ)  # values not cast to their nearest power of two
allowed = 0"""
    return FailureRepro(
        "formats", what, code, "exact: e8m0 holds powers of two, the nearest one in value", {"x": values}
    )


def stochastic_rounding(what: str, x: torch.Tensor, draws: int, seed: int, false_alarm: float) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding, ``draws`` draws of each input under one seed,
    against the rule it promises: each draw one of the input's two bf16 neighbours (from the fp32
    bits), the count away from zero Binomial(draws, p) with p the low 16 bits over 2^16, judged
    by exact binomial p-values (log-gamma sums), Bonferroni over the inputs."""
    code = f"""from torchao.optim.quant_utils import _fp32_to_bf16_sr

n, seed, false_alarm = {draws}, {seed}, {false_alarm!r}
torch.manual_seed(seed)
got = _fp32_to_bf16_sr(x.unsqueeze(0).expand(n, -1).contiguous()).to(torch.float64)
# reference: the bf16 neighbours toward and away from zero, and the exact chance of rounding away
bits = x.view(torch.int32).to(torch.int64)
lo = (bits & ~0xFFFF).to(torch.int32).view(torch.float32).to(torch.float64)
hi = ((bits & ~0xFFFF) + 0x10000).to(torch.int32).view(torch.float32).to(torch.float64)
p_away = ((bits & 0xFFFF).to(torch.float64) / 65536).tolist()
off = int((~((got == lo) | (got == hi))).sum())
away = (got == hi).sum(0).tolist()


def two_sided(k, p):  # exact Binomial(n, p) two-sided p-value: twice the smaller tail, at most 1
    if p in (0.0, 1.0):
        return 1.0 if k == n * p else 0.0
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                    + i * math.log(p) + (n - i) * math.log1p(-p)) for i in range(n + 1)]
    return min(1.0, 2 * min(sum(pmf[: k + 1]), sum(pmf[k:])))


adjusted = [two_sided(k, p) * len(away) for k, p in zip(away, p_away)]  # Bonferroni over the inputs
i = min(range(len(adjusted)), key=adjusted.__getitem__)
print(f"draws off the two neighbours: {{off}} of {{got.numel()}}")
print(f"input {{x[i].item()!r}}: {{away[i]}} of {{n}} draws away from zero, {{n * p_away[i]:.4g}} expected; "
      f"adjusted p-value {{adjusted[i]:.3g}}")
# -log10 of the adjusted p-value (inf: draws off the neighbours); a correct rounding exceeds the
# allowed -log10(false_alarm) once in 1 / false_alarm runs
measured = math.inf if off else -math.log10(max(adjusted[i], 1e-300))
allowed = -math.log10(false_alarm)"""
    return FailureRepro(
        "fp8",
        what,
        code,
        f"every draw a neighbour (exact); each input's count away from zero Binomial({draws}, p): a correct "
        f"rounding falls below the adjusted p-value {false_alarm:g} once in {1 / false_alarm:.0e} runs",
        {"x": x},
        needs=("torch", "torchao"),
    )


def stochastic_draws(what: str, x: torch.Tensor, draws: int, seed: int) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding of ``x`` (one input halfway between its bf16
    neighbours), ``draws`` times under ``seed``, ``seed + 1`` and ``seed`` again: both neighbours
    drawn, the seeds' draws different, the repeated seed's the same."""
    code = f"""from torchao.optim.quant_utils import _fp32_to_bf16_sr

n, seed = {draws}, {seed}


def draw(s):  # n draws of x under torch.manual_seed(s), as the check drew them
    torch.manual_seed(s)
    return _fp32_to_bf16_sr(x.unsqueeze(0).expand(n, -1).contiguous()).to(torch.float64)


a, b, again = draw(seed), draw(seed + 1), draw(seed)
# reference: a stochastic rounding is random (both neighbours of a halfway input, all one with
# chance (1/2)^(n-1); two seeds alike with chance (1/2)^n) and replayable (one seed, one sequence)
wrong = []
if torch.unique(a).numel() != 2:
    wrong.append(f"{{n}} draws of a halfway input gave {{torch.unique(a).numel()}} distinct values, not both neighbours")
if torch.equal(a, b):
    wrong.append(f"seeds {{seed}} and {{seed + 1}} drew the same {{n}} values")
if not torch.equal(a, again):
    wrong.append(f"seed {{seed}} drew {{int((a != again).sum())}} of {{n}} values differently the second time")
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0"""
    return FailureRepro(
        "fp8",
        what,
        code,
        f"exact, up to chance: a correct rounding fails the first two with chance (1/2)^{draws - 1} and "
        f"(1/2)^{draws}, the third never",
        {"x": x},
        needs=("torch", "torchao"),
    )


#: An MX block's e8m0 scale code from its amax, as script source (both MX scripts define it): the
#: OCP modes FLOOR and CEIL from the bits, RCEIL from the exact ratio to the element's max.
_E8M0_CODE = """def e8m0_code(a, mode, elem_max):  # a block's e8m0 code (bias 127), clamped as torchao clamps
    if a == 0:
        return 0
    if mode == "rceil":  # the smallest power of two at or above amax / elem_max, exactly
        q = Fraction(a) / Fraction(elem_max)
        e = q.numerator.bit_length() - q.denominator.bit_length()
        while Fraction(2) ** e < q:
            e += 1
        while Fraction(2) ** (e - 1) >= q:
            e -= 1
        return min(max(e + 127, 0), 254)
    floor = math.frexp(a)[1] - 1  # floor(log2 amax), from the bits
    e = floor if mode == "floor" or a == math.ldexp(1.0, floor) else floor + 1
    return min(max(e - (math.frexp(elem_max)[1] - 1) + 127, 0), 255)"""


def mx_scale_codes(
    what: str, x: torch.Tensor, elem: str, elem_max: float, mode: str, block: int, excused: Sequence[int]
) -> FailureRepro:
    """torchao's MX block scales (``to_mx``) of ``x`` against the e8m0 code each block's amax
    defines (OCP MX: FLOOR, CEIL; RCEIL from the exact ratio to the element's max), with torchao's
    clamps; ``excused``: blocks a registered finding covers (RCEIL one code low near a power of two)."""
    code = f"""from fractions import Fraction

from torchao.prototype.mx_formats import config, mx_tensor

BLOCK, MODE = {block}, {mode!r}
ELEM_MAX = {elem_max!r}  # the element format's largest finite value
EXCUSED = {list(excused)!r}  # blocks of torchao's registered finding torchao-rceil-scale-near-power-of-2
codes, _ = mx_tensor.to_mx(x, {elem}, BLOCK, scaling_mode=config.ScaleCalculationMode(MODE))
got = codes.view(torch.uint8).flatten().tolist()


{_E8M0_CODE}


values = x.tolist()
wrong = 0
for i, g in enumerate(got):
    a = max(abs(v) for v in values[i * BLOCK : (i + 1) * BLOCK])
    want = e8m0_code(a, MODE, ELEM_MAX)
    if g != want and i not in EXCUSED:
        print(f"block {{i}}, amax {{a!r}}: torchao code {{g}}, by definition {{want}}")
        wrong += 1
measured = wrong  # blocks whose scale code differs
allowed = 0"""
    return FailureRepro(
        "fp8", what, code, "exact: the scale code is a function of the block's amax", {"x": x}, ("torch", "torchao")
    )


def block_bits(
    what: str,
    x: torch.Tensor,
    spec: Mapping[str, Any],
    excused_blocks: Sequence[tuple[int, int]],
    excused_elements: Sequence[tuple[int, int]],
) -> FailureRepro:
    """torchao's block-scaled bits of ``x`` (MX: ``MXTensor.to_mx``; NVFP4: ``NVFP4Tensor.to_nvfp4``
    with its per-tensor scale) against the specification in exact rationals: the per-tensor scale,
    each block's scale code and each element's code. ``spec``: ``block`` (rows, cols), ``scale``
    ("e8m0" or "e4m3"), ``mode`` (MX), ``per_tensor``, ``elem`` (``ebits``, ``mbits``, ``max``,
    ``torch``: its torch dtype's name); the excused cells are those a registered torchao finding
    covers."""
    br, bc = spec["block"]
    elem = spec["elem"]
    fp4 = elem["ebits"] + elem["mbits"] == 3
    unpack = (
        "\n\n\ndef unpack(p):  # two e2m1 codes per byte, low nibble first (torchao's packing)\n"
        "    p = p.view(torch.uint8)\n"
        "    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)\n"
        if fp4
        else ""
    )
    as_codes = "unpack(t.qdata)" if fp4 else "t.qdata.view(torch.uint8)"
    if spec["scale"] == "e8m0":
        quantize = f"""from torchao.prototype.mx_formats import config, mx_tensor
{unpack}
t = mx_tensor.MXTensor.to_mx(x, torch.{elem["torch"]}, {bc}, config.ScaleCalculationMode({spec["mode"]!r}))
got_tensor_scale = None"""
    else:
        pts = "nv.per_tensor_amax_to_scale(x.abs().max())" if spec["per_tensor"] else "None"
        quantize = f"""from torchao.prototype.mx_formats import nvfp4_tensor as nv
{unpack}
pts = {pts}
t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
got_tensor_scale = None if pts is None else float(pts)"""
    code = f"""from fractions import Fraction

{quantize}
rows, cols = x.shape
got_scales = t.scale.view(torch.uint8).reshape(rows, cols // {bc}).tolist()
got_codes = {as_codes}.reshape(rows, cols).tolist()

# the specification, in exact rationals
F = Fraction
EBITS, MBITS, EMAX_VALUE = {elem["ebits"]}, {elem["mbits"]}, F({elem["max"]!r})  # the element format
BLOCK = ({br}, {bc})
# covered by torchao's registered findings: block scales (judged with torchao's), and elements
EXCUSED_BLOCKS = {sorted(excused_blocks)!r}
EXCUSED_ELEMENTS = {sorted(excused_elements)!r}


def floor_log2(q):  # floor(log2 q) for a positive rational, exactly
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while F(2) ** e > q:
        e -= 1
    while F(2) ** (e + 1) <= q:
        e += 1
    return e


def rne(q, mbits, emin):  # q >= 0 to nearest with mbits fraction bits, subnormal below 2^emin, ties to even
    if q == 0:
        return F(0)
    quantum = F(2) ** (max(floor_log2(q), emin) - mbits)
    return round(q / quantum) * quantum  # Fraction's round: half to even


def encode(v, ebits, mbits):  # a representable v >= 0 as its code (sign bit clear)
    emin = 2 - 2 ** (ebits - 1)
    if v < F(2) ** emin:
        return int(v / F(2) ** (emin - mbits))
    e = floor_log2(v)
    return (e - emin + 1) << mbits | int(v / F(2) ** (e - mbits)) - (1 << mbits)


def element(x, decode):  # x / decode to nearest even, saturating; the sign is x's
    emin = 2 - 2 ** (EBITS - 1)
    v = min(rne(F(abs(x)) / decode, MBITS, emin), EMAX_VALUE)
    return (1 << (EBITS + MBITS) if math.copysign(1.0, x) < 0 else 0) | encode(v, EBITS, MBITS)


def f32(q):  # a rational to float32, to nearest even (normal range)
    return float(rne(q, 23, -126))


def e4m3(q):  # an e4m3 block scale: clamped to [2^-6, 448], to nearest even
    return encode(rne(min(max(q, F(2) ** -6), F(448)), 3, -6), 4, 3)


def e4m3_value(c):
    e, m = c >> 3, c & 7
    return F(m, 8) * F(2) ** -6 if e == 0 else (1 + F(m, 8)) * F(2) ** (e - 7)
{_BLOCK_SCALE[spec["scale"]].format(mode=spec["mode"], e8m0_code=_E8M0_CODE)}

values = x.tolist()
wrong = 0
tensor_scale = {"f32(F(max(abs(v) for r in values for v in r)) / 2688)" if spec["per_tensor"] else "None"}
SHOWN = 12  # mismatches printed (all are counted)
if tensor_scale != got_tensor_scale:
    print(f"per-tensor scale {{got_tensor_scale!r}}, by definition amax / 2688 = {{tensor_scale!r}}")
    wrong += 1
for i in range(rows // BLOCK[0]):
    for j in range(cols // BLOCK[1]):
        cells = [(r, c) for r in range(i * BLOCK[0], (i + 1) * BLOCK[0]) for c in range(j * BLOCK[1], (j + 1) * BLOCK[1])]
        if tensor_scale == 0:  # a tensor of zeros (or below float32 once divided): nothing to scale
            continue
        g, (want, accepted) = got_scales[i][j], scale_codes(max(abs(values[r][c]) for r, c in cells), tensor_scale)
        if g not in accepted and (i, j) not in EXCUSED_BLOCKS:
            wrong += 1
            if wrong <= SHOWN:
                print(f"block ({{i}}, {{j}}): scale code {{g:#04x}}, by definition {{want:#04x}}")
        use = g if g in accepted or (i, j) in EXCUSED_BLOCKS else want
        for r, c in cells:  # each element with the scale the quantiser chose, where that one was right
            if (r, c) in EXCUSED_ELEMENTS:
                continue
            w, ok = element_codes(values[r][c], decode(use, tensor_scale))
            if got_codes[r][c] not in ok:
                wrong += 1
                if wrong <= SHOWN:
                    print(f"element ({{r}}, {{c}}) = {{values[r][c]!r}}: code {{got_codes[r][c]:#x}}, by definition {{w:#x}}")
if wrong > SHOWN:
    print(f"... and {{wrong - SHOWN}} more")
measured = wrong  # the per-tensor scale, block scales and element codes unlike the definition
allowed = 0"""
    return FailureRepro(
        "fp8",
        what,
        code,
        "exact: the bits are a function of the tensor"
        + (
            " (either neighbour where the exact ratio lies within float32 evaluation's rounding of a tie: two "
            "roundings for a block scale, three for an element)"
            if spec["scale"] == "e4m3"
            else ""
        ),
        {"x": x},
        ("torch", "torchao"),
    )


#: each block-scale family's reference: ``scale_codes(block_amax, tensor_scale)`` -> (the code, the
#: codes accepted), ``decode(code, tensor_scale)``, ``element_codes(x, decode)`` -> (code, accepted)
_BLOCK_SCALE = {
    "e8m0": """


{e8m0_code}


def scale_codes(a, _):  # the block's e8m0 code: one, exactly
    code = e8m0_code(a, {mode!r}, float(EMAX_VALUE))
    return code, (code,)


def decode(code, _):
    return F(2) ** (code - 127)


def element_codes(x, d):  # dividing by a power of two is exact: one code
    c = element(x, d)
    return c, (c,)""",
    "e4m3": """
W_SCALE, W_ELEMENT = (1 + F(1, 2**24)) ** 2 - 1, (1 + F(1, 2**24)) ** 3 - 1  # float32 evaluation's windows


def scale_codes(a, ts):  # NVFP4: e4m3(block_amax / 6 / s_t), and its neighbours within W_SCALE
    q = F(a) / 6 / (F(ts) if ts is not None else 1)
    return e4m3(q), (e4m3(q), e4m3(q * (1 - W_SCALE)), e4m3(q * (1 + W_SCALE)))


def decode(code, ts):
    return e4m3_value(code) * (F(ts) if ts is not None else 1)


def element_codes(x, d):
    return element(x, d), (element(x, d), element(x, d / (1 - W_ELEMENT)), element(x, d / (1 + W_ELEMENT)))""",
}


def e8m0_outcomes(what: str, cases: Sequence[tuple[str, float, int]], device: str = "cpu") -> FailureRepro:
    """torch's float32 -> e8m0 cast of the values whose code left this stack's golden table (ties,
    zero, sign, overflow: what the format leaves open), each against the code the table holds."""
    rows = "\n".join(f"    ({name!r}, {float_src(x)}, {code})," for name, x, code in cases)
    code = f"""# reference: the code each value cast to when this release's golden table was stored
CASES = [
{rows}
]
measured = 0
for name, x, expected in CASES:
    got = torch.tensor([x], dtype=torch.float32, device={device!r}).to(torch.float8_e8m0fnu).view(torch.uint8).item()
    print(f"e8m0 cast of {{name}} ({{x!r}}): code {{got}}; golden {{expected}}" + ("" if got == expected else "   <- differs"))
    measured += got != expected  # casts unlike the golden table's
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: the golden table of this torch release", device=device)


def fp4_casts(what: str, values: torch.Tensor) -> FailureRepro:
    """torchao's e2m1 (fp4) kernels, the casts MX training uses: decode of all 16 codes against the
    bit layout, and float32 -> e2m1 of ``values`` against round-to-nearest-even in exact rationals,
    saturating beyond the largest value (the format has no inf or NaN)."""
    code = """from fractions import Fraction

from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, f32_to_f4_unpacked


# reference: e2m1's bit layout (sign, 2 exponent bits with bias 1, 1 mantissa bit; exponent 0 subnormal)
def decode(c):
    e, m = (c >> 1) & 3, c & 1
    magnitude = m / 2 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -magnitude if c & 8 else magnitude


def nearest_even(v):  # the nearest code in exact rationals, ties to the even code; beyond 6: 6
    sign = 8 if v < 0 or (v == 0 and math.copysign(1.0, v) < 0) else 0
    best = min(range(8), key=lambda c: (abs(Fraction(abs(v)) - Fraction(decode(c))), c & 1))
    return sign | best


codes = torch.arange(16, dtype=torch.uint8)
decoded = f4_unpacked_to_f32(codes).tolist()
bad_decode = [(c, g) for c, g in zip(range(16), decoded) if g != decode(c)]
got = f32_to_f4_unpacked(x).tolist()
bad_round = [(v, g, nearest_even(v)) for v, g in zip(x.tolist(), got) if g != nearest_even(v)]
for c, g in bad_decode[:8]:
    print(f"code {c:#x} decodes to {g!r}; its bit layout says {decode(c)!r}")
for v, g, r in bad_round[:8]:
    print(f"{v!r} cast to code {g:#x} ({decode(g)!r}); nearest-even is {r:#x} ({decode(r)!r})")
measured = len(bad_decode) + len(bad_round)  # codes decoded and values cast unlike the format says
allowed = 0"""
    return FailureRepro(
        "formats",
        what,
        code,
        "exact: e2m1's bit layout, and round-to-nearest-even saturating at 6",
        {"x": values},
        needs=("torch", "torchao"),
    )


def product_against_float64(
    what: str,
    product: str,
    tensors: Mapping[str, torch.Tensor],
    bound: torch.Tensor,
    floor_db: float,
    origin: str,
    *,
    needs: tuple[str, ...] = ("torch",),
    device: str = "cpu",
) -> FailureRepro:
    """A low-precision matrix product (``product``: source setting ``got``, and ``ref``, the same
    product of the high-precision operands in float64) held to an element-wise ``bound`` (saved)
    and an SQNR floor, both derived by the check from the operands' formats and scales."""
    code = f"""{product}
ref = ref.double().to(got.device)
worst = float(((got.double() - ref).abs() / bound.double()).max())  # the worst element, in units of its bound
signal, noise = float(ref.pow(2).sum()), float((got.double() - ref).pow(2).sum())
sqnr_db = 10 * math.log10(signal / noise) if noise > 0 else math.inf
FLOOR_DB = {floor_db!r}  # the SQNR the formats allow at least (standard model of rounding error)
print(f"worst element {{worst:.3g}} x its bound; SQNR {{sqnr_db:.2f}} dB, floor {{FLOOR_DB:.2f}} dB")
measured = max(worst, FLOOR_DB / sqnr_db if sqnr_db > 0 else math.inf)  # each at most 1 when within budget
allowed = 1.0"""
    return FailureRepro("fp8", what, code, origin, {**tensors, "bound": bound.detach()}, needs, device)


def block_scaling_repro_of(
    impl: BlockScaling, rows: list[list[float]], spec: B.BlockSpec, result: BlockConformance, excused: Collection[str]
) -> FailureRepro | None:
    """The standalone reproduction of a failed bit check on torchao's quantiser (None for another:
    the script would need its code): torchao's bits of ``rows`` against the specification written
    out in exact rationals. ``excused``: the findings ("rceil", "smallest", "overflow") the check
    excused for this torchao, whose cells the script excuses too."""

    if not isinstance(impl, TorchaoBlockScaling):
        return None
    found = {k: v for k, v in result.findings.items() if k in excused}
    br, bc = spec.block
    smallest = [
        (r, c)
        for i, j in found.get("smallest", [])
        for r in range(i * br, (i + 1) * br)
        for c in range(j * bc, (j + 1) * bc)
    ]
    elem = {
        "ebits": spec.elem.exponent_bits,
        "mbits": spec.elem.mantissa_bits,
        "max": spec.elem.max,
        "torch": str(torch_elem_dtype(spec)).removeprefix("torch."),
    }
    return block_bits(
        f"torchao's {spec.name} bits ({spec.describe()}) of the failing tensor against the specification",
        torch.tensor(rows, dtype=torch.float32),
        {
            "block": spec.block,
            "scale": spec.scale_format,
            "mode": None if spec.mode is None else spec.mode.value,
            "per_tensor": spec.per_tensor,
            "elem": elem,
        },
        found.get("rceil", []),
        [*smallest, *found.get("overflow", [])],
    )
