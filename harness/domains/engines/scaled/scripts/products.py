"""A low-precision linear layer's product, standalone, against float64: ``torch._scaled_mm`` of
fp8 operands, or torchao's Float8Linear,
its MX linear (``mx_mm``) or NVFP4 casts make the three products of a linear (the output
``x @ w^T``, the input gradient ``go @ w``, the weight gradient ``go^T @ x``); the one judged is
held element-wise to ``bound`` and to an SQNR floor, both derived by the check from the operands'
formats and scales (standard model of rounding error).

amp-harness writes a failed check's operands, bound and values over the defaults below and keeps
the ``torchao`` block that made the product (imported where it is called;
``harness.domains.engines.scaled.products.product_against_float64``). As it lies here the ``stand_in`` block
casts both operands of each product to e4m3 with one scale per tensor and multiplies in float32,
with torch alone, against that recipe's bound.
"""

import math

import torch

# -- inputs --
_gen = torch.Generator().manual_seed(0)
x, w, go = torch.randn(16, 64, generator=_gen), torch.randn(32, 64, generator=_gen), torch.randn(16, 32, generator=_gen)
# two e4m3 roundings of the operands (2^-4 each) per term, summed in magnitude; float32's own below that
bound = (2 * 2.0**-4 + 2.0**-4 * 2.0**-4) * (x.abs().double() @ w.abs().double().t())
# x and w cast to e4m3 with one scale each, and the inverse scales (torch._scaled_mm's operands)
_sx, _sw = 448.0 / x.abs().max(), 448.0 / w.abs().max()
qa, qb, inv_a, inv_b = (x * _sx).to(torch.float8_e4m3fn), (w * _sw).to(torch.float8_e4m3fn), 1 / _sx, 1 / _sw

# -- parameters --
GEMM = "output"  # the product judged: output, grad_input or grad_weight
Products = dict[str, torch.Tensor]

# -- float8_linear --
RECIPE = "tensorwise"  # torchao's Float8LinearConfig recipe
EMULATE = True  # emulated: no fp8 matmul kernel here


def products() -> Products:  # torchao's Float8Linear with weight w: forward of x, backward of go
    import dataclasses

    from torchao import float8

    config = dataclasses.replace(float8.Float8LinearConfig.from_recipe_name(RECIPE), emulate=EMULATE)
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    f8 = float8.convert_to_float8_training(torch.nn.Sequential(lin), config=config).to(x.device)
    xd = x.clone().requires_grad_(True)
    y = f8(xd)
    torch.autograd.backward(y, go)
    return {"output": y.detach(), "grad_input": xd.grad, "grad_weight": f8[0].weight.grad}


# -- mx_linear --
ELEM = torch.float8_e4m3fn  # the element format
BLOCK_SIZE = 32  # elements per block
MODE = "rceil"  # the scale calculation mode


def products() -> Products:  # type: ignore[no-redef]  # noqa: F811
    """Torchao's MX linear: mx_mm, MXFP8Linear's autograd function, emulated matmul, torch casts."""
    try:  # torchao 0.18 on
        from torchao.prototype.moe_training.mxfp8_linear import mx_mm
    except ImportError:  # torchao 0.17
        from torchao.prototype.mx_formats.mx_linear import mx_mm
    from torchao.prototype.mx_formats.config import (
        MXFP8Dim0CastKernelChoice,
        MXFP8Dim1CastKernelChoice,
        ScaleCalculationMode,
    )
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference

    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    dim0, dim1 = MXFP8Dim0CastKernelChoice.TORCH, MXFP8Dim1CastKernelChoice.TORCH
    mode = ScaleCalculationMode(MODE)
    out = mx_mm.apply(xr, wr, ELEM, ELEM, ELEM, BLOCK_SIZE, KernelPreference.EMULATED, dim0, dim1, mode, False)
    torch.autograd.backward(out, go)
    return {"output": out.detach(), "grad_input": xr.grad, "grad_weight": wr.grad}


# -- nvfp4_linear --
PER_TENSOR = True  # NVFP4's per-tensor scale


def products() -> Products:  # type: ignore[no-redef]  # noqa: F811
    """Each product's operands cast to NVFP4 along its contraction by torchao, multiplied in float32."""
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

    def q(a: torch.Tensor) -> torch.Tensor:  # NVFP4 along the last dimension, dequantised
        a = a.float().contiguous()
        scale = per_tensor_amax_to_scale(a.abs().max()) if PER_TENSOR else None
        out: torch.Tensor = NVFP4Tensor.to_nvfp4(a, per_tensor_scale=scale).dequantize(torch.float32)
        return out

    return {"output": q(x) @ q(w).t(), "grad_input": q(go) @ q(w.t()).t(), "grad_weight": q(go.t()) @ q(x.t()).t()}


# -- scaled_mm --
OUT_DTYPE = torch.float32  # the product's output format


def products() -> Products:  # type: ignore[no-redef]  # noqa: F811
    """torch._scaled_mm of the fp8 operands qa, qb (x and w cast) with their inverse scales."""
    return {"output": torch._scaled_mm(qa, qb.t(), scale_a=inv_a, scale_b=inv_b, out_dtype=OUT_DTYPE)}


# -- stand_in --


def products() -> Products:  # type: ignore[no-redef]  # noqa: F811
    """Both operands cast to e4m3, one scale per tensor, multiplied in float32: torch alone."""

    def q(a: torch.Tensor) -> torch.Tensor:
        scale = 448.0 / a.abs().max()
        return (a * scale).to(torch.float8_e4m3fn).float() / scale

    return {"output": q(x) @ q(w).t(), "grad_input": q(go) @ q(w), "grad_weight": q(go).t() @ q(x)}


# -- reference_output --
# reference: the same product of the high-precision operands, in float64 (a forward's only product:
# the script of a product without an output gradient)
ref = x.double() @ w.double().t()

# -- reference --
# reference: the same product of the high-precision operands, in float64
ref = {
    "output": lambda: x.double() @ w.double().t(),
    "grad_input": lambda: go.double() @ w.double(),
    "grad_weight": lambda: go.double().t() @ x.double(),
}[GEMM]()

# -- judgement --
FLOOR_DB = 20.0  # the SQNR the formats allow at least (standard model of rounding error)
got = products()[GEMM]
ref = ref.to(got.device)
worst = float(((got.double() - ref).abs() / bound.double()).max())  # the worst element, in units of its bound
signal, noise = float(ref.pow(2).sum()), float((got.double() - ref).pow(2).sum())
sqnr_db = 10 * math.log10(signal / noise) if noise > 0 else math.inf
print(f"worst element {worst:.3g} x its bound; SQNR {sqnr_db:.2f} dB, floor {FLOOR_DB:.2f} dB")
measured = max(worst, FLOOR_DB / sqnr_db if sqnr_db > 0 else math.inf)  # each at most 1 when within budget
allowed = 1.0
