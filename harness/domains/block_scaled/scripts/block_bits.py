"""Block-scaled formats' bits, standalone, against their specification in exact rationals: MX
block scales (e8m0 codes from each block's amax: OCP FLOOR and CEIL from the bits, RCEIL from the
exact ratio to the element's max, with torchao's clamps), and whole MX or NVFP4 tensors (the
per-tensor scale, each block's scale code, each element's code).

amp-harness writes a failed check's tensor and values over the defaults below and keeps the
``torchao`` blocks (``to_mx``, ``MXTensor.to_mx``, ``NVFP4Tensor.to_nvfp4``, imported where
called; ``harness.domains.block_scaled.repro``). As it lies here the ``stand_in`` blocks quantise to
MXFP8 (e4m3 elements, FLOOR scales) with torch alone; the excused cells are those a registered
torchao finding covers.
"""

import math
from fractions import Fraction

import torch

# -- inputs --
x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 10.0

# -- e8m0_code --


def e8m0_code(a: float, mode: str, elem_max: float) -> int:  # a block's e8m0 code (bias 127), clamped as torchao
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
    return min(max(e - (math.frexp(elem_max)[1] - 1) + 127, 0), 255)


# -- mx_parameters --
MODE = "floor"  # the scale calculation mode: floor, ceil, even or rceil
ELEM_DTYPE = torch.float8_e4m3fn  # the element format
ELEM_MAX = 448.0  # the element format's largest finite value
BLOCK_SIZE = 32  # elements per block, along the last dimension

# -- mx_torchao --


def mx_codes(x: torch.Tensor) -> list[int]:  # torchao's MX block scale codes of x
    from torchao.prototype.mx_formats import config, mx_tensor

    codes, _ = mx_tensor.to_mx(x, ELEM_DTYPE, BLOCK_SIZE, scaling_mode=config.ScaleCalculationMode(MODE))
    got: list[int] = codes.view(torch.uint8).flatten().tolist()
    return got


# -- mx_stand_in --


def mx_codes(x: torch.Tensor) -> list[int]:  # type: ignore[no-redef]  # noqa: F811  (FLOOR, from the bits)
    amax = x.reshape(-1, BLOCK_SIZE).abs().amax(-1)
    code = torch.frexp(amax).exponent - 1 - (math.frexp(ELEM_MAX)[1] - 1) + 127
    got: list[int] = torch.where(amax == 0, 0, code.clamp(0, 255)).tolist()
    return got


# -- mx_scales --
EXCUSED: list[int] = []  # blocks of torchao's registered finding torchao-rceil-scale-near-power-of-2
got = mx_codes(x)
values = x.flatten().tolist()
wrong = 0
for i, g in enumerate(got):
    a = max(abs(v) for v in values[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
    want = e8m0_code(a, MODE, ELEM_MAX)
    if g != want and i not in EXCUSED:
        print(f"block {i}, amax {a!r}: code {g} under test, by definition {want}")
        wrong += 1
measured = wrong  # blocks whose scale code differs
allowed = 0

# -- bits_parameters --
PER_TENSOR = False  # NVFP4's per-tensor scale (amax / 2688)
FP4 = False  # e2m1 elements, two to a byte
Quantized = tuple[float | None, torch.Tensor, torch.Tensor]  # per-tensor scale, block scale bits, element codes


def unpack(p: torch.Tensor) -> torch.Tensor:  # two e2m1 codes per byte, low nibble first (torchao's packing)
    p = p.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


# -- bits_torchao_mx --


def quantize(x: torch.Tensor) -> Quantized:  # torchao's MX tensor of x
    from torchao.prototype.mx_formats import config, mx_tensor

    t = mx_tensor.MXTensor.to_mx(x, ELEM_DTYPE, BLOCK_SIZE, config.ScaleCalculationMode(MODE))
    return None, t.scale.view(torch.uint8), unpack(t.qdata) if FP4 else t.qdata.view(torch.uint8)


# -- bits_torchao_nvfp4 --


def quantize(x: torch.Tensor) -> Quantized:  # type: ignore[no-redef]  # noqa: F811  (torchao's NVFP4 tensor of x)
    from torchao.prototype.mx_formats import nvfp4_tensor as nv

    pts = nv.per_tensor_amax_to_scale(x.abs().max()) if PER_TENSOR else None
    t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
    return None if pts is None else float(pts), t.scale.view(torch.uint8), unpack(t.qdata)


# -- bits_stand_in --


def quantize(x: torch.Tensor) -> Quantized:  # type: ignore[no-redef]  # noqa: F811  (MXFP8, FLOOR, torch alone)
    rows, cols = x.shape
    blocks = x.reshape(rows, cols // BLOCK_SIZE, BLOCK_SIZE)
    code = torch.tensor(mx_codes(x)).reshape(rows, cols // BLOCK_SIZE)
    scaled = blocks / torch.exp2(code.float() - 127).unsqueeze(-1)  # a power of two: exact
    elements = scaled.clamp(-ELEM_MAX, ELEM_MAX).to(ELEM_DTYPE).view(torch.uint8)  # saturating, to nearest even
    return None, code.to(torch.uint8), elements.reshape(rows, cols)


# -- spec --
# the specification, in exact rationals
F = Fraction
EBITS = 4  # the element format's exponent bits
MBITS = 3  # its mantissa bits
EMAX_VALUE = F(448.0)  # its largest value
BLOCK = (1, 32)  # a block's rows and columns
# covered by torchao's registered findings: block scales (judged with torchao's), and elements
EXCUSED_BLOCKS: list[tuple[int, int]] = []
EXCUSED_ELEMENTS: list[tuple[int, int]] = []
got_tensor_scale, scale_bits, code_bits = quantize(x)
rows, cols = x.shape
got_scales = scale_bits.reshape(rows, cols // BLOCK[1]).tolist()
got_codes = code_bits.reshape(rows, cols).tolist()


def floor_log2(q: Fraction) -> int:  # floor(log2 q) for a positive rational, exactly
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while F(2) ** e > q:
        e -= 1
    while F(2) ** (e + 1) <= q:
        e += 1
    return e


def rne(q: Fraction, mbits: int, emin: int) -> Fraction:  # q >= 0 to nearest, subnormal below 2^emin, ties even
    if q == 0:
        return F(0)
    quantum = F(2) ** (max(floor_log2(q), emin) - mbits)
    return round(q / quantum) * quantum  # Fraction's round: half to even


def encode(v: Fraction, ebits: int, mbits: int) -> int:  # a representable v >= 0 as its code (sign bit clear)
    emin = 2 - (1 << (ebits - 1))
    if v < F(2) ** emin:
        return int(v / F(2) ** (emin - mbits))
    e = floor_log2(v)
    return (e - emin + 1) << mbits | int(v / F(2) ** (e - mbits)) - (1 << mbits)


def element(x: float, decode: Fraction) -> int:  # x / decode to nearest even, saturating; the sign is x's
    emin = 2 - 2 ** (EBITS - 1)
    v = min(rne(F(abs(x)) / decode, MBITS, emin), EMAX_VALUE)
    return (1 << (EBITS + MBITS) if math.copysign(1.0, x) < 0 else 0) | encode(v, EBITS, MBITS)


def f32(q: Fraction) -> float:  # a rational to float32, to nearest even (normal range)
    return float(rne(q, 23, -126))


def e4m3(q: Fraction) -> int:  # an e4m3 block scale: clamped to [2^-6, 448], to nearest even
    return encode(rne(min(max(q, F(2) ** -6), F(448)), 3, -6), 4, 3)


def e4m3_value(c: int) -> Fraction:
    e, m = c >> 3, c & 7
    return F(m, 8) * F(2) ** -6 if e == 0 else (1 + F(m, 8)) * F(2) ** (e - 7)


# -- scale_e4m3 --
W_SCALE, W_ELEMENT = (1 + F(1, 2**24)) ** 2 - 1, (1 + F(1, 2**24)) ** 3 - 1  # float32 evaluation's windows


def scale_codes(a: float, ts: float | None) -> tuple[int, tuple[int, ...]]:
    """NVFP4: e4m3(block_amax / 6 / s_t), and its neighbours within W_SCALE."""
    q = F(a) / 6 / (F(ts) if ts is not None else 1)
    return e4m3(q), (e4m3(q), e4m3(q * (1 - W_SCALE)), e4m3(q * (1 + W_SCALE)))


def decode(code: int, ts: float | None) -> Fraction:
    return e4m3_value(code) * (F(ts) if ts is not None else 1)


def element_codes(x: float, d: Fraction) -> tuple[int, tuple[int, ...]]:
    return element(x, d), (element(x, d), element(x, d / (1 - W_ELEMENT)), element(x, d / (1 + W_ELEMENT)))


# -- scale_e8m0 --


def scale_codes(a: float, ts: float | None) -> tuple[int, tuple[int, ...]]:  # type: ignore[no-redef]  # noqa: F811
    """The block's e8m0 code: one, exactly."""
    code = e8m0_code(a, MODE, float(EMAX_VALUE))
    return code, (code,)


def decode(code: int, ts: float | None) -> Fraction:  # type: ignore[no-redef]  # noqa: F811
    return F(2) ** (code - 127)


def element_codes(x: float, d: Fraction) -> tuple[int, tuple[int, ...]]:  # type: ignore[no-redef]  # noqa: F811
    c = element(x, d)  # dividing by a power of two is exact: one code
    return c, (c,)


# -- bits --
rows_of = x.tolist()
wrong = 0
tensor_scale = f32(F(max(abs(v) for r in rows_of for v in r)) / 2688) if PER_TENSOR else None
SHOWN = 12  # mismatches printed (all are counted)
if tensor_scale != got_tensor_scale:
    print(f"per-tensor scale {got_tensor_scale!r}, by definition amax / 2688 = {tensor_scale!r}")
    wrong += 1
for i in range(rows // BLOCK[0]):
    for j in range(cols // BLOCK[1]):
        r0, c0 = i * BLOCK[0], j * BLOCK[1]
        cells = [(r, c) for r in range(r0, r0 + BLOCK[0]) for c in range(c0, c0 + BLOCK[1])]
        if tensor_scale == 0:  # a tensor of zeros (or below float32 once divided): nothing to scale
            continue
        g, (want, accepted) = got_scales[i][j], scale_codes(max(abs(rows_of[r][c]) for r, c in cells), tensor_scale)
        if g not in accepted and (i, j) not in EXCUSED_BLOCKS:
            wrong += 1
            if wrong <= SHOWN:
                print(f"block ({i}, {j}): scale code {g:#04x}, by definition {want:#04x}")
        use = g if g in accepted or (i, j) in EXCUSED_BLOCKS else want
        for r, c in cells:  # each element with the scale the quantiser chose, where that one was right
            if (r, c) in EXCUSED_ELEMENTS:
                continue
            w, ok = element_codes(rows_of[r][c], decode(use, tensor_scale))
            if got_codes[r][c] not in ok:
                wrong += 1
                if wrong <= SHOWN:
                    print(f"element ({r}, {c}) = {rows_of[r][c]!r}: code {got_codes[r][c]:#x}, by definition {w:#x}")
if wrong > SHOWN:
    print(f"... and {wrong - SHOWN} more")
measured = wrong  # the per-tensor scale, block scales and element codes unlike the definition
allowed = 0
