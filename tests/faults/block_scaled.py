"""Faults of the block-scaled family: MX and NVFP4 quantisers and linears wrong in one way (a binade-high scale, transposed tiles, fp4 gradients), and torchao's own functions patched. Each is a factory ``fault(original) -> replacement`` or a
subclass wrong in one way, named by the negative controls that inject it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from faults.stacks import resolve
from harness.domains.block_scaled.blocklinear import EmulatedBlockLinear, TorchaoBlockLinear
from harness.domains.block_scaled.blockquant import BlockQuantized, TorchaoBlockScaling, TorchBlockScaling
from harness.numerics.blockscaled import BlockSpec
from harness.numerics.formats import FP8_E4M3FN


def to_mx_scale_binade_high(real: Callable[..., Any]) -> Callable[..., Any]:
    """torchao's MX ``to_mx`` storing every e8m0 block scale one code high (an exponent bias off by
    one) over elements quantised with the right one: every MX value decodes at twice its size."""

    def to_mx(*args: Any, **kwargs: Any) -> Any:
        scale, data = real(*args, **kwargs)
        return (scale.view(torch.uint8) + 1).view(scale.dtype), data

    return to_mx


def to_mx_zero_block_scale_nan(real: Callable[..., Any]) -> Callable[..., Any]:
    """torchao's MX ``to_mx`` giving a block of zeros the e8m0 NaN code (255), as a scale computed
    from log2(0) = -inf and wrapped instead of clamped would: the block dequantises to NaN."""

    def to_mx(data_hp: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        scale, data = real(data_hp, *args, **kwargs)
        codes = scale.view(torch.uint8)
        zero = data_hp.reshape(*codes.shape, -1).abs().amax(-1) == 0
        return torch.where(zero, 255, codes).to(torch.uint8).view(scale.dtype), data

    return to_mx


def f4_cast_toward_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's float32 -> e2m1 (fp4) cast truncating: where the nearest code lies above the value
    in magnitude, the code one below (sign and magnitude: the low three bits minus one)."""
    decode = resolve("torchao.prototype.mx_formats.kernels.f4_unpacked_to_f32")

    def f32_to_f4_unpacked(x: torch.Tensor) -> torch.Tensor:
        out = real(x)
        above = decode(out).abs() > x.abs()
        return torch.where(above & ((out & 7) > 0), out - 1, out)

    return f32_to_f4_unpacked


# -- block-scaled quantisers (MX, NVFP4) ----------------------------------------------------------------
class BlockScaleOneBinadeHigh(TorchaoBlockScaling):
    """torchao's quantiser with every block scale stored one binade high (an exponent bias off by
    one: e8m0 code + 1, e4m3 exponent field + 1); the elements were quantised with the right one,
    so every value decodes at twice its size."""

    name = "block scale one binade high"

    def quantize(self, x: torch.Tensor, spec: BlockSpec) -> BlockQuantized:
        good = super().quantize(x, spec)
        step = 1 if spec.scale_format == "e8m0" else 1 << FP8_E4M3FN.mantissa_bits
        return replace(good, scale_codes=good.scale_codes + step, values=good.values * 2)


class LinearOverBinadeHighScales(EmulatedBlockLinear):
    """A block-scaled linear over :class:`BlockScaleOneBinadeHigh`: every operand decodes at twice
    its size, so every product is four times the float64 one."""

    def __init__(self) -> None:
        super().__init__(BlockScaleOneBinadeHigh())


class Fp4GradientsLinear(TorchaoBlockLinear):
    """torchao's MX linear with its output gradients cast to e2m1 where the recipe says e4m3 (a
    recipe table that mixes up MXFP8 and MXFP4 for the backward): both gradients lose ~13 dB, the
    output is untouched."""

    name = "MX linear with fp4 gradients"

    def __init__(self) -> None:
        super().__init__(grad_dtype=torch.float4_e2m1fn_x2)


class E5m2GradientsLinear(TorchaoBlockLinear):
    """torchao's MX linear with its output gradients cast to e5m2 where MXFP8 says e4m3 (the
    float8 tensorwise recipes' gradient format carried over): two significand bits fewer in the
    backward only."""

    name = "MX linear with e5m2 gradients"

    def __init__(self) -> None:
        super().__init__(grad_dtype=torch.float8_e5m2)


class UsersAdapterOverTorchao:
    """A user's own MX quantiser that inherits torchao's substitute divisor at the smallest e8m0
    scale: the registry excuses torchao's releases, not code of one's own, so it must fail."""

    name = "a user's adapter over torchao"

    def __init__(self) -> None:
        self._torchao = TorchaoBlockScaling()

    def unsupported(self, spec: BlockSpec) -> str | None:
        return self._torchao.unsupported(spec)

    def quantize(self, x: torch.Tensor, spec: BlockSpec) -> BlockQuantized:
        return self._torchao.quantize(x, spec)


class TransposedTiles(TorchBlockScaling):
    """The harness's own NVFP4 quantiser with its 16x16 tile scales laid out transposed (tile (i, j)
    quantised and stored with tile (j, i)'s scale): the layout bug of a colwise copy that reuses the
    rowwise scale grid without transposing it."""

    name = "2-D tile scales transposed"

    def block_amax(self, x: torch.Tensor, spec: BlockSpec) -> torch.Tensor:
        grid = super().block_amax(x, spec)
        return grid.T.contiguous() if spec.block[0] > 1 and grid.shape[0] == grid.shape[1] else grid


def nvfp4_zero_guarded(original: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A torchao whose per-tensor NVFP4 scale treats a zero amax as 1 (TransformerEngine's guard):
    the registered zero-tensor finding "appears fixed"."""

    def fixed(amax: torch.Tensor) -> torch.Tensor:
        return torch.where(amax == 0, torch.ones_like(original(amax)), original(amax))

    return fixed


def one_less(original: int) -> int:
    """A constant one below torchao's (an element format's largest power of two, off by one)."""
    return original - 1
