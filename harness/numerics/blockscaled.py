"""Block-scaled formats as executable specifications: MX (e8m0 block scales) and NVFP4.

A block-scaled tensor stores small elements and one scale per block of neighbours, so that each
block's largest magnitude lands near the element format's maximum. The recipes in use:

* **MXFP8** (OCP MX 1.0): e4m3 elements, blocks of 32 along the reduction dimension, e8m0
  (power-of-two) scales chosen by one of torchao's modes (:class:`~harness.numerics.scaled.MxScaleMode`).
* **MXFP4**: the same with e2m1 elements.
* **NVFP4** (NVIDIA's): e2m1 elements, blocks of 16, an e4m3 *decode* scale per block and one float32
  decode scale per tensor beneath it: ``s_t = amax / (448 x 6)`` (so the largest block's scale lands
  at e4m3's maximum), ``S_b = e4m3(block_amax / 6 / s_t)`` clamped to e4m3's normal range, and each
  element ``e2m1(x / (S_b s_t))``, saturating. Weights may share one scale per 16 x 16 tile
  (TransformerEngine's and torchao's NVFP4 training recipes), so the same tile serves the
  transposed weight of the backward pass.

Every formula is evaluated here in exact rational arithmetic, rounded once: independent of torch and
torchao, pure (no pytest, no files, no torch). Implementations evaluate the NVFP4 formulas in float32
(two roundings for a block scale, three for an element's ratio); where the exact value lies within
that many float32 roundings of a rounding boundary, :func:`explained_scale` and
:func:`explained_element` accept either neighbour,
and the suites count how often it had to.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

from harness.numerics.formats import FP4_E2M1, FP8_E4M3FN, FP32, FloatFormat
from harness.numerics.scaled import MxScaleMode, amax, e8m0_decode, mx_scale_code

#: NVFP4's per-tensor scale divides the tensor's amax by the largest block scale times the largest
#: element: e4m3's maximum (448) times e2m1's (6)
NVFP4_TENSOR_DIVISOR = int(FP8_E4M3FN.max * FP4_E2M1.max)


@dataclass(frozen=True)
class BlockSpec:
    """One block-scaled cast: element format, block shape (rows, cols sharing a scale), scale format."""

    name: str
    elem: FloatFormat
    block: tuple[int, int]
    #: "e8m0" (MX: powers of two, picked by ``mode``) or "e4m3" (NVFP4)
    scale_format: str
    mode: MxScaleMode | None = None
    #: NVFP4's second level: a float32 decode scale per tensor under the e4m3 block scales
    per_tensor: bool = False

    def describe(self) -> str:
        scale = (
            f"e8m0 ({self.mode.value})" if self.mode else "e4m3" + (" x float32 per tensor" if self.per_tensor else "")
        )
        return f"{self.elem.short} elements, {self.block[0]}x{self.block[1]} blocks, {scale} scales"


#: The recipes' casts, by name.
SPECS: dict[str, BlockSpec] = {
    s.name: s
    for s in (
        *(BlockSpec(f"mxfp8-{m.value}", FP8_E4M3FN, (1, 32), "e8m0", m) for m in MxScaleMode),
        *(BlockSpec(f"mxfp4-{m.value}", FP4_E2M1, (1, 32), "e8m0", m) for m in MxScaleMode),
        BlockSpec("nvfp4", FP4_E2M1, (1, 16), "e4m3", per_tensor=True),
        BlockSpec("nvfp4-single-level", FP4_E2M1, (1, 16), "e4m3"),
        BlockSpec("nvfp4-2d", FP4_E2M1, (16, 16), "e4m3", per_tensor=True),
    )
}


@dataclass(frozen=True)
class BlockCodes:
    """A block-scaled tensor as bits: the per-tensor scale (NVFP4), one scale code per block (a grid
    of block rows x block cols), and one element code per element (the tensor's shape)."""

    tensor_scale: float | None
    scale_codes: list[list[int]]
    codes: list[list[int]]


def tiles(rows: int, cols: int, block: tuple[int, int]) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
    """(block row, block col, the element indices of that block), row-major over the block grid."""
    br, bc = block
    if rows % br or cols % bc:
        raise ValueError(f"a {rows}x{cols} tensor does not divide into {br}x{bc} blocks")
    for i in range(rows // br):
        for j in range(cols // bc):
            yield i, j, [(r, c) for r in range(i * br, (i + 1) * br) for c in range(j * bc, (j + 1) * bc)]


def nvfp4_tensor_scale(tensor_amax: float) -> float:
    """NVFP4's float32 per-tensor decode scale: amax / 2688, correctly rounded (0 for a zero tensor)."""
    q = Fraction(tensor_amax) / NVFP4_TENSOR_DIVISOR
    r = FP32.round_ratio(q.numerator, q.denominator)
    assert r.bits is not None
    return FP32.decode(r.bits)


def nvfp4_scale_ratio(block_amax: float, tensor_scale: float | None) -> Fraction:
    """The exact block decode scale before e4m3 rounding: block_amax / 6 (/ s_t)."""
    q = Fraction(block_amax) / Fraction(FP4_E2M1.max)
    return q if tensor_scale is None else q / Fraction(tensor_scale)


def e4m3_scale_code(q: Fraction) -> int:
    """An e4m3 block scale: clamped to [smallest normal, max] (a block of zeros or tiny values still
    gets a usable scale; none overflows to NaN), then rounded to nearest even."""
    q = min(max(q, Fraction(FP8_E4M3FN.smallest_normal)), Fraction(FP8_E4M3FN.max))
    r = FP8_E4M3FN.round_ratio(q.numerator, q.denominator)
    assert r.bits is not None
    return r.bits


def element_code(x: float, decode: Fraction, elem: FloatFormat) -> int:
    """An element's code: x / decode rounded to nearest even, saturating at the format's maximum;
    the sign is x's (a negative value that rounds to zero keeps its sign bit)."""
    negative = math.copysign(1.0, x) < 0
    sign = elem.sign_bit if negative else 0
    p = Fraction(abs(x)) / decode
    r = elem.round_ratio(p.numerator, p.denominator, negative=negative)
    return sign | elem.max_finite_bits if r.bits is None or r.overflow else r.bits


def decode_scale(spec: BlockSpec, scale_code: int, tensor_scale: float | None) -> Fraction:
    """The factor an element code is multiplied by to decode it."""
    if spec.scale_format == "e8m0":
        return Fraction(e8m0_decode(scale_code))
    s = Fraction(FP8_E4M3FN.decode(scale_code))
    return s * Fraction(tensor_scale) if spec.per_tensor and tensor_scale is not None else s


def scale_code(spec: BlockSpec, block_amax: float, tensor_scale: float | None) -> int:
    """The reference scale code of a block with amax ``block_amax``."""
    if spec.scale_format == "e8m0":
        assert spec.mode is not None
        return mx_scale_code(block_amax, spec.elem, spec.mode)
    return e4m3_scale_code(nvfp4_scale_ratio(block_amax, tensor_scale if spec.per_tensor else None))


def quantize(
    rows: Sequence[Sequence[float]], spec: BlockSpec, scale_codes: Sequence[Sequence[int]] | None = None
) -> BlockCodes:
    """The reference bits of a finite 2-D tensor (a tensor of zeros included: its per-tensor scale
    is 0 and every element code 0).

    ``scale_codes``: quantise the elements with these scales instead of the reference's (an
    implementation's, where its scale was accepted), so that one explained scale does not count
    again as 16 or 32 element mismatches.
    """
    n, m = len(rows), len(rows[0]) if rows else 0
    tensor_scale = nvfp4_tensor_scale(amax([v for r in rows for v in r])) if spec.per_tensor else None
    grid = [[0] * (m // spec.block[1]) for _ in range(n // spec.block[0])]
    codes = [[0] * m for _ in range(n)]
    for i, j, cells in tiles(n, m, spec.block):
        if tensor_scale == 0.0:
            continue  # a tensor of zeros (or of values below float32's range once divided): zeros
        code = scale_code(spec, amax([rows[r][c] for r, c in cells]), tensor_scale)
        grid[i][j] = code
        used = code if scale_codes is None else scale_codes[i][j]
        decode = decode_scale(spec, used, tensor_scale)
        for r, c in cells:
            codes[r][c] = element_code(rows[r][c], decode, spec.elem)
    if tensor_scale == 0.0:
        codes = [[spec.elem.sign_bit if math.copysign(1.0, v) < 0 else 0 for v in row] for row in rows]
    return BlockCodes(tensor_scale, grid, codes)


def float32_window(roundings: int) -> Fraction:
    """The relative error of ``roundings`` successive float32 roundings: (1 + 2^-24)^k - 1."""
    return (1 + Fraction(FP32.unit_roundoff)) ** roundings - 1


#: float32 roundings in an implementation's NVFP4 block scale (block_amax / 6, then / s_t)
SCALE_ROUNDINGS = 2
#: float32 roundings in its element ratio (1 / s_t, / S_b, then x times that)
ELEMENT_ROUNDINGS = 3


def explained_scale(spec: BlockSpec, block_amax: float, tensor_scale: float | None, got: int) -> bool:
    """An NVFP4 block scale code that differs from the reference's only because the exact ratio lies
    within float32 evaluation's window of an e4m3 rounding boundary (MX scales: never)."""
    if spec.scale_format != "e4m3":
        return False
    q = nvfp4_scale_ratio(block_amax, tensor_scale if spec.per_tensor else None)
    w = float32_window(SCALE_ROUNDINGS)
    return got in (e4m3_scale_code(q * (1 - w)), e4m3_scale_code(q * (1 + w)))


def explained_element(spec: BlockSpec, x: float, decode: Fraction, got: int) -> bool:
    """An NVFP4 element code that differs from the reference's only because x / decode lies within
    float32 evaluation's window of an e2m1 rounding boundary (MX elements: never; dividing by a
    power of two is exact)."""
    if spec.scale_format != "e4m3":
        return False
    w = float32_window(ELEMENT_ROUNDINGS)
    return got in (element_code(x, decode / (1 - w), spec.elem), element_code(x, decode / (1 + w), spec.elem))
