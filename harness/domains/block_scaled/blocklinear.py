"""Block-scaled (MX, NVFP4) linear layers under test and the budgets of their three products.

A linear layer trained in a block-scaled recipe makes three products, each with both operands
quantised in blocks along the contraction dimension: the output ``x @ w^T`` (x and w in blocks
along in_features), the input gradient ``g @ w`` (g and w along out_features) and the weight
gradient ``g^T @ x`` (both along the batch). Each is judged against float64 on the unquantised
operands by :func:`harness.domains.engines.scaled.matmul.budget`, with :class:`BlockOperand` supplying the
per-element error of a block-scaled cast: the exact reference's decode scale of each block
(:mod:`harness.numerics.blockscaled`, never the implementation's own), round-to-nearest within it,
and saturation where a block's largest element exceeds the format's maximum at that scale (FLOOR
scales, and NVFP4's e4m3 block scales rounded down).

The implementations: torchao's MX linear (``mx_mm``, the autograd function behind MXFP8Linear, with
its emulated matmul and plain-torch casts, so the CPU judges torchao's own operand layout), and
:class:`EmulatedBlockLinear`, which makes the three products from any :class:`BlockScaling`
quantiser (torchao's NVFP4 has no CPU training linear: its NVFP4Linear is Triton/CuteDSL only).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from harness.domains.block_scaled.blockquant import BlockScaling, TorchaoBlockScaling, torch_elem_dtype
from harness.domains.engines.scaled.matmul import ScaledBudget, budget
from harness.numerics import blockscaled as B
from harness.numerics.scaled import amax
from harness.platform.thirdparty import import_first_of, import_third_party

#: where torchao's MX linear (``mx_mm``) lives, newest release first
MX_LINEAR_MODULES = ("torchao.prototype.moe_training.mxfp8_linear", "torchao.prototype.mx_formats.mx_linear")

#: the designed chance that a correct cast's noise power exceeds :meth:`BlockOperand.relative_noise`
NOISE_FALSE_ALARM = 1e-6


@dataclass(frozen=True)
class BlockOperand:
    """One operand of a product (m x k) quantised in blocks along k: its float64 values and each
    element's decode scale under the exact specification."""

    values: torch.Tensor
    spec: B.BlockSpec
    decode: torch.Tensor

    @property
    def short(self) -> str:
        return f"{self.spec.elem.short} ({self.spec.name})"

    #: how :meth:`error` and :meth:`relative_noise` are derived, for a budget's origin
    origin = (
        "casts within half an ulp at the exact block scale (or the overshoot where a block saturates), "
        "noise h^2/3 per rounding plus Hoeffding's spread at p = 1e-6 per operand"
    )

    def error(self) -> torch.Tensor:
        """Bound on |dequantised - exact| per element: half an ulp of the element format in the
        binade of x / decode (half its smallest subnormal below its normal range), times the
        block's decode scale; or the overshoot past the format's maximum where it saturates."""
        a = self.values.abs()
        elem = self.spec.elem
        v = (a / self.decode).clamp_min(elem.smallest_normal)
        half_ulp = torch.exp2(torch.floor(torch.log2(v)) - elem.mantissa_bits - 1)
        # log2 of an exact power of two is exact in float64, and a value just below one rounds to
        # the binade below, where half an ulp is smaller: take the larger neighbour to stay a bound
        half_ulp = torch.maximum(
            half_ulp, torch.exp2(torch.floor(torch.log2(v * (1 + 2.0**-40))) - elem.mantissa_bits - 1)
        )
        return torch.maximum(half_ulp * self.decode, a - elem.max * self.decode)

    def relative_noise(self) -> float:
        """The cast's noise power relative to the operand's, at most, but for a designed chance of
        :data:`NOISE_FALSE_ALARM`: each rounding error uniform within its half ulp h (the standard
        model: mean h^2/3), their sum of squares above its mean by Hoeffding's bound
        sqrt(ln(1/p)/2 sum h^4) at most; each saturation its whole overshoot squared."""
        a = self.values.abs()
        elem = self.spec.elem
        h = self.error()
        saturated = a > elem.max * self.decode
        rounding = torch.where(saturated, 0.0, h)
        overshoot = torch.where(saturated, h, 0.0)
        mean = float(rounding.pow(2).sum()) / 3
        spread = math.sqrt(math.log(1 / NOISE_FALSE_ALARM) / 2 * float(rounding.pow(4).sum()))
        signal = max(float(self.values.pow(2).sum()), torch.finfo(torch.float64).tiny)
        return (mean + spread + float(overshoot.pow(2).sum())) / signal

    def t(self) -> BlockOperand:
        """The transposed operand (the right-hand side of a product, blocked along its rows)."""
        return BlockOperand(self.values.T, self.spec, self.decode.T)


def block_operand(x: torch.Tensor, spec: B.BlockSpec) -> BlockOperand:
    """``x`` (m x k) as the exact specification quantises it in blocks along k."""
    rows = x.to(torch.float32).tolist()
    tensor_scale = B.nvfp4_tensor_scale(amax([v for r in rows for v in r])) if spec.per_tensor else None
    decode = torch.empty(x.shape, dtype=torch.float64)
    for i, j, cells in B.tiles(len(rows), len(rows[0]), spec.block):
        code = B.scale_code(spec, amax([rows[r][c] for r, c in cells]), tensor_scale)
        d = float(B.decode_scale(spec, code, tensor_scale))
        br, bc = spec.block
        decode[i * br : (i + 1) * br, j * bc : (j + 1) * bc] = d
    return BlockOperand(x.to(torch.float64), spec, decode)


class LinearProducts(NamedTuple):
    """A linear layer's three products (float32): ``x @ w^T``, ``g @ w``, ``g^T @ x``."""

    output: torch.Tensor
    grad_input: torch.Tensor
    grad_weight: torch.Tensor


#: the products in the order of :class:`LinearProducts`
PRODUCTS = LinearProducts._fields


class BlockLinear(Protocol):
    """A block-scaled linear layer to be judged: ``unsupported(spec)`` says why it cannot run a
    recipe here (the check then skips saying so), or None; ``mm(x, w, spec)`` is its product
    ``x @ w^T`` for input ``x`` (m x k) and weight ``w`` (n x k), differentiable in both: its
    backward makes the two gradient products. :func:`linear_products` runs all three."""

    name: str

    def unsupported(self, spec: B.BlockSpec) -> str | None: ...

    def mm(self, x: torch.Tensor, w: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor: ...


def linear_products(
    linear: BlockLinear, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, spec: B.BlockSpec
) -> LinearProducts:
    """``linear``'s output for ``x`` and ``w`` and, with output gradient ``g`` (m x n), its input and
    weight gradients."""
    xr = x.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)
    out = linear.mm(xr, wr, spec)
    out.backward(g)  # type: ignore[no-untyped-call]
    assert xr.grad is not None and wr.grad is not None, f"{linear.name}: mm() is not differentiable in x and w"
    return LinearProducts(out.detach(), xr.grad, wr.grad)


class _EmulatedMM(torch.autograd.Function):
    """``x @ w^T`` with every operand of the three products quantised along its contraction."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, q: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.q = q
        return q(x) @ q(w).T

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w = ctx.saved_tensors
        q = ctx.q
        return q(g) @ q(w.T).T, q(g.T) @ q(x.T).T, None


class EmulatedBlockLinear:
    """A block-scaled linear from a block quantiser: each operand of each product quantised along
    the contraction by ``quantiser`` and multiplied dequantised in float32 (an emulated recipe)."""

    def __init__(self, quantiser: BlockScaling) -> None:
        self.quantiser = quantiser
        self.name = f"emulated over {quantiser.name}"

    def unsupported(self, spec: B.BlockSpec) -> str | None:
        return self.quantiser.unsupported(spec)

    def mm(self, x: torch.Tensor, w: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
        def q(a: torch.Tensor) -> torch.Tensor:
            return self.quantiser.quantize(a.detach().float().contiguous(), spec).values.to(a.dtype)

        out: torch.Tensor = _EmulatedMM.apply(x, w, q)  # type: ignore[no-untyped-call]
        return out


class TorchaoBlockLinear:
    """torchao's block-scaled linear: MX recipes through ``mx_mm`` (MXFP8Linear's autograd
    function) with its emulated matmul and plain-torch casts; NVFP4 through
    :class:`EmulatedBlockLinear` over torchao's quantiser.

    ``grad_dtype``: cast the MX recipes' output gradients to this element dtype instead of the
    recipe's (e5m2 gradients, as some MXFP8 recipes use; the rates scripts' format slips)."""

    name = "torchao"

    def __init__(self, grad_dtype: torch.dtype | None = None) -> None:
        self._nvfp4 = EmulatedBlockLinear(TorchaoBlockScaling())
        self.grad_dtype = grad_dtype

    def unsupported(self, spec: B.BlockSpec) -> str | None:
        if spec.scale_format == "e4m3":
            return self._nvfp4.unsupported(spec)
        return None

    def mm(self, x: torch.Tensor, w: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
        if spec.scale_format == "e4m3":
            return self._nvfp4.mm(x, w, spec)
        linear = import_first_of(*MX_LINEAR_MODULES)
        cfg = import_third_party("torchao.prototype.mx_formats.config")
        pref = import_third_party("torchao.quantization.quantize_.common.kernel_preference")
        assert spec.mode is not None
        elem = torch_elem_dtype(spec)
        out: torch.Tensor = linear.mx_mm.apply(
            x,
            w,
            elem,
            elem,
            elem if self.grad_dtype is None else self.grad_dtype,
            spec.block[1],
            pref.KernelPreference.EMULATED,
            cfg.MXFP8Dim0CastKernelChoice.TORCH,
            cfg.MXFP8Dim1CastKernelChoice.TORCH,
            cfg.ScaleCalculationMode(spec.mode.value),
            False,
        )
        return out


def product_budgets(
    x: torch.Tensor, w: torch.Tensor, g: torch.Tensor, spec: B.BlockSpec
) -> dict[str, tuple[torch.Tensor, ScaledBudget]]:
    """Each product's float64 reference and budget, by name (:data:`PRODUCTS`)."""
    operands = {
        "output": (block_operand(x, spec), block_operand(w, spec).t()),
        "grad_input": (block_operand(g, spec), block_operand(w.T, spec).t()),
        "grad_weight": (block_operand(g.T, spec), block_operand(x.T, spec).t()),
    }
    return {name: (a.values @ b.values, budget(a, b)) for name, (a, b) in operands.items()}


@dataclass(frozen=True)
class PublishedFloor:
    """An SQNR floor a library's own tests hold its recipe to, with where it is stated."""

    sqnr_db: float
    source: str


#: torchao's own floors for its block-scaled linears (against a bf16 reference, on their shapes):
#: recorded beside the harness's derived floors, never judged (their reference and shapes differ)
TORCHAO_FLOORS: dict[tuple[str, str], PublishedFloor] = {
    **{
        ("mxfp8", name): PublishedFloor(
            db, "pytorch/ao test/prototype/moe_training/test_mxfp8_linear.py (1024x1024x2048)"
        )
        for name, db in (("output", 27.0), ("grad_input", 25.0), ("grad_weight", 24.0))
    },
    ("nvfp4", "output"): PublishedFloor(
        15.0, "pytorch/ao test/prototype/moe_training/nvfp4_training/test_nvfp4_linear.py (512^3)"
    ),
}


def published_floor(spec: B.BlockSpec, product: str) -> PublishedFloor | None:
    """torchao's floor for ``product`` of ``spec``'s recipe family, if it states one."""
    family = spec.name.split("-")[0]
    return TORCHAO_FLOORS.get((family, product))


#: each product's float64 reference, as script source over the script's tensors x, w, g
def torchao_script(spec: B.BlockSpec, product: str) -> tuple[str, dict[str, str]]:
    """The block of ``harness/domains/engines/scaled/scripts/products.py`` that makes ``product`` of
    torchao's linear under ``spec`` from the script's tensors ``x``, ``w``, ``go``, and its values:
    the calls :class:`TorchaoBlockLinear` makes, with nothing of the harness."""
    if spec.scale_format == "e8m0":
        assert spec.mode is not None
        values = {
            "ELEM": str(torch_elem_dtype(spec)),  # "torch.float8_e4m3fn"
            "BLOCK_SIZE": repr(spec.block[1]),
            "MODE": repr(spec.mode.value),
            "GEMM": repr(product),
        }
        return "mx_linear", values
    return "nvfp4_linear", {"PER_TENSOR": repr(spec.per_tensor), "GEMM": repr(product)}
