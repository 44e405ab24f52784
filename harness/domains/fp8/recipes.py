"""torchao's float8 training recipes, written down as specifications.

A linear layer runs three matmuls: the output (input x weight^T), the input gradient (grad_output
x weight) and the weight gradient (grad_output^T x input). A recipe says, for each operand of each
matmul, the fp8 format, which elements share a scale, and whether scales are powers of two. The
table below is written from torchao's recipe documentation (``Float8LinearRecipeName``); the suite
checks torchao's own configuration against it, then torchao's scales and casts against
:mod:`harness.numerics.scaled`, so a release that changes a recipe fails with the operand named.

Operand shapes, as the spec sees them: input (tokens, in), weight (out, in), grad_output
(tokens, out). ``axis`` is the dimension reduced to find each amax.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.numerics.formats import FP8_E4M3FN, FP8_E5M2, format_of
from harness.numerics.scaled import CastSpec, Granularity

TENSOR = Granularity.TENSOR
AXIS = Granularity.AXIS

#: the three matmuls of a linear layer and their two operands each, in the spec's names
GEMMS: dict[str, tuple[str, str]] = {
    "output": ("input", "weight"),
    "grad_input": ("grad_output", "weight"),
    "grad_weight": ("grad_output", "input"),
}


@dataclass(frozen=True)
class Fp8Recipe:
    """One float8 training recipe: the cast of each operand of each matmul (None: high precision)."""

    name: str
    casts: dict[tuple[str, str], CastSpec | None]

    def cast(self, gemm: str, operand: str) -> CastSpec | None:
        return self.casts[(gemm, operand)]


def _tensorwise() -> Fp8Recipe:
    e4, e5 = CastSpec(FP8_E4M3FN), CastSpec(FP8_E5M2)
    return Fp8Recipe(
        "tensorwise",
        {
            ("output", "input"): e4,
            ("output", "weight"): e4,
            ("grad_input", "grad_output"): e5,
            ("grad_input", "weight"): e4,
            ("grad_weight", "grad_output"): e5,
            ("grad_weight", "input"): e4,
        },
    )


def _rowwise() -> Fp8Recipe:
    def row(axis: int) -> CastSpec:
        return CastSpec(FP8_E4M3FN, AXIS, axis, power_of_2=True)

    return Fp8Recipe(
        "rowwise",
        {
            # every operand is e4m3 (grad_output too), scaled along the matmul's reduction dimension
            ("output", "input"): row(-1),
            ("output", "weight"): row(-1),
            ("grad_input", "grad_output"): row(-1),
            ("grad_input", "weight"): row(0),
            ("grad_weight", "grad_output"): row(0),
            ("grad_weight", "input"): row(0),
        },
    )


def _rowwise_with_gw_hp() -> Fp8Recipe:
    row = CastSpec(FP8_E4M3FN, AXIS, -1, power_of_2=True)
    return Fp8Recipe(
        "rowwise_with_gw_hp",
        {
            ("output", "input"): row,
            ("output", "weight"): row,
            ("grad_input", "grad_output"): row,
            ("grad_input", "weight"): CastSpec(FP8_E4M3FN, TENSOR, power_of_2=True),
            # the weight gradient stays in high precision: its accuracy matters most
            ("grad_weight", "grad_output"): None,
            ("grad_weight", "input"): None,
        },
    )


RECIPES: dict[str, Fp8Recipe] = {r.name: r for r in (_tensorwise(), _rowwise(), _rowwise_with_gw_hp())}


def recipe(name: str) -> Fp8Recipe:
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown float8 recipe {name!r}; known: {', '.join(RECIPES)}") from None


# -- torchao's configuration, read back into the spec's terms ----------------------------------------
#: torchao's config field for each (gemm, operand) of the spec, and the axiswise dim torchao passes
#: for the tensor it actually casts (weight^T (in, out) for the weight operands; grad_output reshaped
#: to 2-D). ``torchao.float8.float8_linear.matmul_with_hp_or_float8_args`` is where these come from.
_TORCHAO_FIELDS: dict[tuple[str, str], str] = {
    ("output", "input"): "cast_config_input",
    ("output", "weight"): "cast_config_weight",
    ("grad_input", "grad_output"): "cast_config_grad_output",
    ("grad_input", "weight"): "cast_config_weight_for_grad_input",
    ("grad_weight", "grad_output"): "cast_config_grad_output_for_grad_weight",
    ("grad_weight", "input"): "cast_config_input_for_grad_weight",
}


def from_torchao_config(name: str, config: object) -> Fp8Recipe:
    """A torchao ``Float8LinearConfig`` in the spec's terms (axes in the spec's operand layout)."""
    import torch

    casts: dict[tuple[str, str], CastSpec | None] = {}
    pow2 = bool(getattr(config, "round_scales_to_power_of_2", False))
    for (gemm, operand), field in _TORCHAO_FIELDS.items():
        cc = getattr(config, field)
        if str(cc.scaling_type.value) == "disabled":
            casts[(gemm, operand)] = None
            continue
        dtype = cc.target_dtype
        assert isinstance(dtype, torch.dtype)
        if str(cc.scaling_granularity.value) == "tensorwise":
            casts[(gemm, operand)] = CastSpec(format_of(dtype), TENSOR, power_of_2=pow2)
        else:
            casts[(gemm, operand)] = CastSpec(format_of(dtype), AXIS, _spec_axis(gemm, operand), power_of_2=pow2)
    return Fp8Recipe(name, casts)


def _spec_axis(gemm: str, operand: str) -> int:
    """The reduced axis in the spec's layout: each operand is scaled along its matmul's reduction
    dimension (the only axiswise layout torch._scaled_mm's rowwise kernel accepts)."""
    reduction = {
        ("output", "input"): -1,  # input (tokens, in) reduced over in
        ("output", "weight"): -1,  # weight (out, in) reduced over in
        ("grad_input", "grad_output"): -1,  # grad_output (tokens, out) reduced over out
        ("grad_input", "weight"): 0,  # weight (out, in) reduced over out
        ("grad_weight", "grad_output"): 0,  # grad_output (tokens, out) reduced over tokens
        ("grad_weight", "input"): 0,  # input (tokens, in) reduced over tokens
    }
    return reduction[(gemm, operand)]
