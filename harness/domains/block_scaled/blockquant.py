"""Block-scaled quantisers under test (MX, NVFP4) and their conformance to the exact specification.

The block-scaling suite asks an implementation one thing per :class:`~harness.numerics.blockscaled.BlockSpec`:
the bits of a 2-D float32 tensor (per-tensor scale, block scale codes, element codes) and the values
they decode to. :func:`check_block_scaling` compares the bits with
:func:`harness.numerics.blockscaled.quantize`. torchao's quantisers are the default implementation;
:class:`TorchBlockScaling` is the harness's own in plain torch (MX and NVFP4), which checks the
specification itself where torchao has no CPU path (the 2-D weight tiles), as the delayed-scaling
suite does, and is the correctly rounded recipe the block-scaled training steps are compared with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

import torch

from harness.numerics import blockscaled as B
from harness.numerics.formats import FP4_E2M1, FP8_E4M3FN, FP32
from harness.numerics.rounding import (
    E2M1_MAGNITUDES,
    e2m1_round,
    floor_log2,
    round_to_format,
    stochastic_round_to_format,
)
from harness.numerics.scaled import E8M0_BIAS, MxScaleMode, amax, emax, near_power_of_2
from harness.platform.thirdparty import import_third_party


@dataclass(frozen=True)
class BlockQuantized:
    """An implementation's block-scaled tensor: the per-tensor decode scale (NVFP4), the scale codes
    as a (block rows, block cols) uint8 grid, the element codes (x's shape, uint8, one code per
    element: fp4 unpacked) and the float32 values they decode to."""

    tensor_scale: float | None
    scale_codes: torch.Tensor
    codes: torch.Tensor
    values: torch.Tensor


class BlockScaling(Protocol):
    """What a block-scaled quantiser implements to be judged against the specification.

    ``unsupported``: why this implementation cannot quantise ``spec`` here (the check then skips
    saying so), or None. ``quantize``: the tensor's bits and decoded values.

    Example, your own NVFP4 quantiser::

        class MyNvfp4:
            name = "mine"
            def unsupported(self, spec): return None if spec.name.startswith("nvfp4") else "MX only"
            def quantize(self, x, spec):
                q = my_fp4.quantize(x, block=spec.block)
                return BlockQuantized(q.global_scale, q.block_scales.view(torch.uint8), q.codes, q.dequantize())

        @pytest.fixture
        def block_scaling_under_test():
            return MyNvfp4()
    """

    name: str

    def unsupported(self, spec: B.BlockSpec) -> str | None: ...

    def quantize(self, x: torch.Tensor, spec: B.BlockSpec) -> BlockQuantized: ...


def _unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Two e2m1 codes per byte (low nibble first, torchao's packing) as one code per element."""
    p = packed.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)


def torch_elem_dtype(spec: B.BlockSpec) -> torch.dtype:
    """The torch dtype torchao's MX casts take for ``spec``'s elements (fp4: two per byte)."""
    return torch.float8_e4m3fn if spec.elem is FP8_E4M3FN else torch.float4_e2m1fn_x2


class TorchaoBlockScaling:
    """torchao's MX (``MXTensor.to_mx``) and NVFP4 (``NVFP4Tensor.to_nvfp4`` with the per-tensor
    scale ``per_tensor_amax_to_scale`` gives it) quantisers, the calls its training recipes make."""

    name = "torchao"

    def unsupported(self, spec: B.BlockSpec) -> str | None:
        if spec.block[0] != 1:
            return (
                "torchao quantises 16x16 NVFP4 weight tiles only in a Triton kernel "
                "(moe_training.nvfp4_training.quantize_2d_triton) that needs a Blackwell GPU (SM100+); "
                "its eager quantiser has 1x16 blocks"
            )
        return None

    def quantize(self, x: torch.Tensor, spec: B.BlockSpec) -> BlockQuantized:
        rows, cols = x.shape
        if spec.scale_format == "e8m0":
            mx = import_third_party("torchao.prototype.mx_formats.mx_tensor")
            cfg = import_third_party("torchao.prototype.mx_formats.config")
            assert spec.mode is not None
            t = mx.MXTensor.to_mx(x, torch_elem_dtype(spec), spec.block[1], cfg.ScaleCalculationMode(spec.mode.value))
            codes = t.qdata.view(torch.uint8) if spec.elem is FP8_E4M3FN else _unpack_fp4(t.qdata)
            grid = t.scale.view(torch.uint8).reshape(rows, cols // spec.block[1])
            return BlockQuantized(None, grid, codes.reshape(rows, cols), t.dequantize(torch.float32))
        nv = import_third_party("torchao.prototype.mx_formats.nvfp4_tensor")
        pts = nv.per_tensor_amax_to_scale(x.abs().max()) if spec.per_tensor else None
        t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
        grid = t.scale.view(torch.uint8).reshape(rows, cols // spec.block[1])
        tensor_scale = None if pts is None else float(pts)
        return BlockQuantized(tensor_scale, grid, _unpack_fp4(t.qdata), t.dequantize(torch.float32))


# -- the harness's own, in plain torch ---------------------------------------------------------------
def _e8m0_codes(block_amax: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
    """MX scale codes of float64 block amaxes (:func:`harness.numerics.scaled.mx_scale_code`, with
    exact comparisons against powers of two instead of rationals)."""
    a = block_amax
    positive = a > 0
    floor = floor_log2(torch.where(positive, a, 1.0))  # 2^floor <= a < 2^(floor + 1)
    if spec.mode is MxScaleMode.RCEIL:
        # the smallest e with a <= elem_max x 2^e (each product exact in float64); elem_max lies in
        # [2^emax, 2^(emax+1)), so e is emax below floor, or one or two above that
        e = floor - emax(spec.elem) - 1
        for _ in range(3):
            e = torch.where(spec.elem.max * torch.exp2(e) < a, e + 1, e)
        code = (e + E8M0_BIAS).clamp(0, 254)
    else:
        e = floor if spec.mode is MxScaleMode.FLOOR else torch.where(torch.exp2(floor) == a, floor, floor + 1)
        code = (e - emax(spec.elem) + E8M0_BIAS).clamp(0, 255)
    return torch.where(positive, code, 0.0).to(torch.uint8)


class TorchBlockScaling:
    """The harness's own block quantiser in plain torch (MX with each scale mode; NVFP4 in 1x16
    and 16x16 blocks, one or two levels): the specification run as code, for the claims torchao
    cannot show on this host, and the correctly rounded recipe the block-scaled training lane
    compares a step with. Ratios in float64 and elements rounded by :func:`round_to_format`, so it
    lands inside the float32 window everywhere the reference accepts torchao."""

    name = "harness (plain torch)"

    def unsupported(self, spec: B.BlockSpec) -> str | None:
        return None

    def block_amax(self, x: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
        rows, cols = x.shape
        br, bc = spec.block
        return x.abs().reshape(rows // br, br, cols // bc, bc).amax(dim=(1, 3))

    def expand(self, grid: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
        br, bc = spec.block
        return grid.repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)

    def quantize(self, x: torch.Tensor, spec: B.BlockSpec, generator: torch.Generator | None = None) -> BlockQuantized:
        """``generator``: round the elements stochastically (:func:`stochastic_round_to_format`)
        with it instead of to nearest; the scales are the specification's either way."""
        x64 = x.to(torch.float64)
        if spec.scale_format == "e8m0":
            scales = _e8m0_codes(self.block_amax(x64, spec), spec)
            decode = self.expand(torch.exp2(scales.to(torch.float64) - E8M0_BIAS), spec)
            values = self._round(x64 / decode, spec, generator)
            return BlockQuantized(None, scales, self._codes(values, spec), (values * decode).to(torch.float32))
        if spec.per_tensor:
            tensor_scale = float((x64.abs().max() / B.NVFP4_TENSOR_DIVISOR).to(torch.float32))
            st = torch.tensor(tensor_scale, dtype=torch.float64)
        else:
            tensor_scale, st = None, torch.tensor(1.0, dtype=torch.float64)
        ratio = self.block_amax(x64, spec) / FP4_E2M1.max / (st if tensor_scale != 0.0 else 1.0)
        scales = ratio.clamp(FP8_E4M3FN.smallest_normal, FP8_E4M3FN.max).to(torch.float8_e4m3fn)
        decode = self.expand(scales.to(torch.float64), spec) * st
        if tensor_scale == 0.0:
            codes = torch.signbit(x64).to(torch.uint8) << 3
        else:
            codes = self._codes(self._round(x64 / decode, spec, generator), spec)
        values = (
            E2M1_MAGNITUDES.to(codes.device)[(codes & 7).long()] * torch.where((codes & 8) > 0, -1.0, 1.0) * decode
        ).to(torch.float32)
        return BlockQuantized(tensor_scale, scales.view(torch.uint8), codes, values)

    @staticmethod
    def _round(v: torch.Tensor, spec: B.BlockSpec, generator: torch.Generator | None) -> torch.Tensor:
        if generator is None:
            return round_to_format(v, spec.elem)
        return stochastic_round_to_format(v, spec.elem, generator)

    @staticmethod
    def _codes(values: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
        """Element codes of values already in the element format (so the conversion is exact)."""
        if spec.elem is FP8_E4M3FN:
            return values.to(torch.float8_e4m3fn).view(torch.uint8)
        return e2m1_round(values)


#: What torchao 0.18 divides a block's elements by when its e8m0 scale code is 0 (2^-127), per
#: mode: float32's smallest normal for FLOOR and CEIL, TransformerEngine's reciprocal 1 for RCEIL.
SMALLEST_SCALE_DIVISOR = {
    MxScaleMode.FLOOR: Fraction(2) ** -126,
    MxScaleMode.CEIL: Fraction(2) ** -126,
    MxScaleMode.RCEIL: Fraction(1),
}


def _smallest_scale_block(
    spec: B.BlockSpec, rows: list[list[float]], cells: list[tuple[int, int]], codes: list[list[int]]
) -> bool:
    """Whether a code-0 MX block's element codes are exactly those of torchao's substitute divisor."""
    if spec.mode is None:
        return False
    divisor = SMALLEST_SCALE_DIVISOR[spec.mode]
    return all(codes[r][c] == B.element_code(rows[r][c], divisor, spec.elem) for r, c in cells)


def reciprocal_overflows(tensor_scale: float | None, block_scale: Fraction) -> bool:
    """Whether torchao's float32 element multiplier (1 / ``tensor_scale``) / ``block_scale`` is
    infinite: a per-tensor scale below about 2^-128, or below 2^-122 for a block at e4m3's
    smallest scale 2^-6 (a block of zeros)."""
    if tensor_scale is None or tensor_scale == 0.0:
        return False
    inverse = Fraction(1) / Fraction(tensor_scale)
    if inverse >= _FP32_OVERFLOW:
        return True
    return Fraction(FP32.round(float(inverse))) / block_scale >= _FP32_OVERFLOW


#: the smallest ratio float32 rounds to inf: its largest finite value plus half an ulp (a tie,
#: which rounds to the even neighbour: inf)
_FP32_OVERFLOW = Fraction(2) ** 128 - Fraction(2) ** (127 - 24)


def _overflow_element(x: float, got: int) -> bool:
    """torchao's code for ``x`` times an infinite reciprocal: +-6 (code 7) for a nonzero element, the
    float32 NaN of 0 x inf cast to e2m1 for a zero (code 3 under either NaN sign)."""
    return got & 7 == (7 if x != 0.0 else 3) and (x == 0.0 or bool(got & 8) == (x < 0))


# -- conformance ---------------------------------------------------------------------------------------
@dataclass
class BlockConformance:
    """The verdict on one tensor: every mismatch with the reference, and the deviations float32
    evaluation explains (counted, not failed)."""

    spec: B.BlockSpec
    elements: int
    problems: list[str] = field(default_factory=list)
    explained_scales: int = 0
    explained_elements: int = 0
    #: where torchao's registered findings were seen (a reproduction excuses those the check
    #: excuses): "rceil", blocks whose RCEIL scale is one code low next to a power of two (the
    #: float32 log2 finding); "smallest", blocks at e8m0 code 0 whose elements were divided by
    #: torchao's substitute divisor (:data:`SMALLEST_SCALE_DIVISOR`,
    #: ``torchao-mx-smallest-scale-divisor``); "overflow", NVFP4 elements of a tensor whose per-tensor
    #: scale has no finite float32 reciprocal, stored as torchao stores them (nonzero: +-6, zero: the
    #: NaN code; ``torchao-nvfp4-tiny-tensor-reciprocal-overflow``)
    findings: dict[str, list[tuple[int, int]]] = field(
        default_factory=lambda: {"rceil": [], "smallest": [], "overflow": []}
    )

    @property
    def rceil_finding(self) -> int:
        return len(self.findings["rceil"])

    @property
    def smallest_scale_finding(self) -> int:
        return len(self.findings["smallest"])

    @property
    def reciprocal_overflow_finding(self) -> int:
        return len(self.findings["overflow"])

    @property
    def passed(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        more = f" (+{len(self.problems) - 4} more)" if len(self.problems) > 4 else ""
        return f"{self.spec.describe()}: " + "; ".join(self.problems[:4]) + more


def check_block_scaling(impl: BlockScaling, rows: list[list[float]], spec: B.BlockSpec) -> BlockConformance:
    """``impl``'s bits of ``rows`` against the exact reference: the per-tensor scale bit for bit,
    each block scale code and each element code exactly or inside float32 evaluation's window."""
    x = torch.tensor(rows, dtype=torch.float32)
    got = impl.quantize(x, spec)
    result = BlockConformance(spec, x.numel())
    want = B.quantize(rows, spec)
    if spec.per_tensor and got.tensor_scale != want.tensor_scale:
        result.problems.append(
            f"per-tensor scale {got.tensor_scale!r}, expected amax / {B.NVFP4_TENSOR_DIVISOR} = {want.tensor_scale!r}"
        )
        return result
    br, bc = spec.block
    shape = (len(rows) // br, len(rows[0]) // bc)
    if tuple(got.scale_codes.shape) != shape or tuple(got.codes.shape) != tuple(x.shape):
        result.problems.append(
            f"scale grid {tuple(got.scale_codes.shape)} and codes {tuple(got.codes.shape)}; expected {shape} "
            f"(one scale per {br}x{bc} block) and {tuple(x.shape)}"
        )
        return result
    grid = got.scale_codes.to(torch.int64).tolist()
    accepted = [list(r) for r in want.scale_codes]
    for i, j, cells in B.tiles(len(rows), len(rows[0]), spec.block):
        g, w = grid[i][j], want.scale_codes[i][j]
        if g == w or want.tensor_scale == 0.0:
            accepted[i][j] = g
            continue
        block_amax = amax([rows[r][c] for r, c in cells])
        if B.explained_scale(spec, block_amax, want.tensor_scale, g):
            result.explained_scales += 1
            accepted[i][j] = g
            continue
        if (
            spec.mode is MxScaleMode.RCEIL
            and g == w - 1
            and block_amax > 0
            and near_power_of_2(block_amax / spec.elem.max)
        ):
            result.findings["rceil"].append((i, j))
            accepted[i][j] = g
            continue
        result.problems.append(f"block ({i}, {j}) amax {block_amax!r}: scale code {g:#04x}, expected {w:#04x}")
    exact = B.quantize(rows, spec, accepted)
    codes = got.codes.to(torch.int64).tolist()
    for i, j, cells in B.tiles(len(rows), len(rows[0]), spec.block):
        decode = None if want.tensor_scale == 0.0 else B.decode_scale(spec, accepted[i][j], want.tensor_scale)
        overflows = spec.per_tensor and reciprocal_overflows(
            want.tensor_scale, B.decode_scale(spec, accepted[i][j], None)
        )
        if (
            spec.scale_format == "e8m0"
            and accepted[i][j] == 0
            and any(codes[r][c] != exact.codes[r][c] for r, c in cells)
            and _smallest_scale_block(spec, rows, cells, codes)
        ):
            result.findings["smallest"].append((i, j))
            continue
        for r, c in cells:
            g, w = codes[r][c], exact.codes[r][c]
            if g == w:
                continue
            if decode is not None and B.explained_element(spec, rows[r][c], decode, g):
                result.explained_elements += 1
                continue
            if overflows and _overflow_element(rows[r][c], g):
                result.findings["overflow"].append((r, c))
                continue
            result.problems.append(f"element ({r}, {c}) = {rows[r][c]!r}: code {g:#x}, expected {w:#x}")
    return result
