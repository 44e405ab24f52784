"""The block-scaled family's reproductions: torchao's MX and NVFP4 scale codes and bits against the
specification written out in exact rationals (``scripts/block_bits.py``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from harness.domains.block_scaled.blockquant import (
    BlockConformance,
    BlockScaling,
    TorchaoBlockScaling,
    torch_elem_dtype,
)
from harness.domains.repro import FailureRepro, ScriptTemplate
from harness.numerics import blockscaled as B

BLOCK_BITS = ScriptTemplate(__package__ or "harness.domains.block_scaled", "block_bits")
ZEROS = ScriptTemplate(__package__ or "harness.domains.block_scaled", "zeros")


def mx_scale_codes(
    what: str, x: torch.Tensor, elem: str, elem_max: float, mode: str, block: int, excused: Sequence[int]
) -> FailureRepro:
    """torchao's MX block scales (``to_mx``) of ``x`` against the e8m0 code each block's amax
    defines (OCP MX: FLOOR, CEIL; RCEIL from the exact ratio to the element's max), with torchao's
    clamps; ``excused``: blocks a registered finding covers (RCEIL one code low near a power of two)."""
    values = {
        "MODE": repr(mode),
        "ELEM_DTYPE": elem,
        "ELEM_MAX": repr(elem_max),
        "BLOCK_SIZE": repr(block),
        "EXCUSED": repr(list(excused)),
    }
    code = BLOCK_BITS.fill("e8m0_code", "mx_parameters", "mx_torchao", "mx_scales", values=values)
    return FailureRepro(
        "block_scaled",
        what,
        code,
        "exact: the scale code is a function of the block's amax",
        {"x": x},
        ("torch", "torchao"),
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
    e8m0 = spec["scale"] == "e8m0"
    values = {
        "MODE": repr(spec["mode"]),
        "ELEM_DTYPE": f"torch.{elem['torch']}",
        "BLOCK_SIZE": repr(bc),
        "PER_TENSOR": repr(bool(spec["per_tensor"])),
        "FP4": repr(elem["ebits"] + elem["mbits"] == 3),
        "EBITS": repr(elem["ebits"]),
        "MBITS": repr(elem["mbits"]),
        "EMAX_VALUE": f"F({elem['max']!r})",
        "BLOCK": repr((br, bc)),
        "EXCUSED_BLOCKS": repr(sorted(excused_blocks)),
        "EXCUSED_ELEMENTS": repr(sorted(excused_elements)),
    }
    blocks = (
        *(("e8m0_code", "mx_parameters") if e8m0 else ()),
        "bits_parameters",
        "bits_torchao_mx" if e8m0 else "bits_torchao_nvfp4",
        "spec",
        "scale_e8m0" if e8m0 else "scale_e4m3",
        "bits",
    )
    if not e8m0:  # NVFP4: the MX parameters are not in the script
        values = {k: v for k, v in values.items() if k not in ("MODE", "ELEM_DTYPE", "BLOCK_SIZE")}
    code = BLOCK_BITS.fill(*blocks, values=values)
    return FailureRepro(
        "block_scaled",
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


def zeros_repro_of(impl: BlockScaling, spec: B.BlockSpec) -> FailureRepro | None:
    """The standalone reproduction of a tensor of zeros that did not come back zero from torchao's
    quantiser (None for another: the script would need its code), with the cast ``spec`` names."""
    if not isinstance(impl, TorchaoBlockScaling):
        return None
    if spec.scale_format == "e8m0":
        assert spec.mode is not None
        values = {
            "BLOCK": repr(spec.block),
            "MODE": repr(spec.mode.value),
            "ELEM_DTYPE": str(torch_elem_dtype(spec)),
        }
        cast = "torchao_mx"
    else:
        values = {"BLOCK": repr(spec.block), "PER_TENSOR": repr(bool(spec.per_tensor))}
        cast = "torchao_nvfp4"
    return FailureRepro(
        "block_scaled",
        f"values of torchao's {spec.name} ({spec.describe()}) of a tensor of zeros, dequantised, that are not zero",
        ZEROS.fill("parameters", cast, "zeros", values=values),
        "exact: zero is representable in every block-scaled format",
        {},
        ("torch", "torchao"),
    )
