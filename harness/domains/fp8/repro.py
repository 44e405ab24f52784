"""The fp8 family's reproductions: scales, codes, e8m0 and fp4 casts, MX and NVFP4 block bits and
stochastic rounding against their exact definitions, and scaled products against float64."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from harness.domains.fp8.blockquant import BlockConformance, BlockScaling, TorchaoBlockScaling, torch_elem_dtype
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src, float_src
from harness.numerics import blockscaled as B
from harness.numerics.formats import format_of

#: the family's scripts, each a file of ``scripts/``
FP8_SCALES = ScriptTemplate(__package__ or "harness.domains.fp8", "fp8_scales")
FORMAT_CODES = ScriptTemplate(__package__ or "harness.domains.fp8", "format_codes")
STOCHASTIC = ScriptTemplate(__package__ or "harness.domains.fp8", "stochastic")
BLOCK_BITS = ScriptTemplate(__package__ or "harness.domains.fp8", "block_bits")
PRODUCTS = ScriptTemplate(__package__ or "harness.domains.fp8", "products")


def fp8_scales(
    what: str, x: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float, axis: int | None, power_of_2: bool
) -> FailureRepro:
    """torchao's fp8 scales of ``x`` against their definition, fp8_max / max(amax, 1e-12) in float64
    rounded once to float32 (power of two: the largest not above it, from the bits)."""
    values = {
        "FP8_DTYPE": dtype_src(fp8_dtype),
        "FP8_MAX": repr(fp8_max),
        "AXIS": repr(axis),
        "POWER_OF_2": repr(power_of_2),
    }
    code = FP8_SCALES.fill("parameters", "torchao", "judgement", values=values)
    return FailureRepro(
        "fp8", what, code, "exact: the scale is defined to one float32 rounding", {"x": x}, ("torch", "torchao")
    )


def code_decoding(what: str, dtype_name: str) -> FailureRepro:
    """torch's decoding of all 256 codes of an 8-bit float format (viewed from uint8, converted to
    float32) against the value each code's bit layout defines, written out from the layout."""
    if dtype_name == "float8_e8m0fnu":  # exponent only: 2^(code - 127), 0xFF NaN (OCP MX)
        layout = {"EB": "8", "MB": "0", "BIAS": "127", "KIND": "'e8m0'"}
    else:
        fmt = format_of(dtype_name)
        kind = "ieee" if fmt.encoding.value == "ieee" else "fn"
        layout = {"EB": str(fmt.exponent_bits), "MB": str(fmt.mantissa_bits), "BIAS": str(fmt.bias), "KIND": repr(kind)}
    code = FORMAT_CODES.fill("decoding", values={"DTYPE": f"torch.{dtype_name}", **layout})
    return FailureRepro("formats", what, code, "exact: a code's value follows from the format's bit layout")


def e8m0_rounding(what: str, values: torch.Tensor) -> FailureRepro:
    """torch's float32 -> e8m0 cast of positive values, none of them a tie, against the nearest
    power of two in value, found exactly (frexp and comparisons of Python floats)."""
    code = FORMAT_CODES.fill("e8m0_rounding")
    return FailureRepro(
        "formats", what, code, "exact: e8m0 holds powers of two, the nearest one in value", {"x": values}
    )


def stochastic_rounding(what: str, x: torch.Tensor, draws: int, seed: int, false_alarm: float) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding, ``draws`` draws of each input under one seed,
    against the rule it promises: each draw one of the input's two bf16 neighbours (from the fp32
    bits), the count away from zero Binomial(draws, p) with p the low 16 bits over 2^16, judged
    by exact binomial p-values (log-gamma sums), Bonferroni over the inputs."""
    values = {"N": repr(draws), "SEED": repr(seed), "FALSE_ALARM": repr(false_alarm)}
    code = STOCHASTIC.fill("torchao", "counts", values=values)
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
    code = STOCHASTIC.fill("torchao", "draws", values={"N": repr(draws), "SEED": repr(seed)})
    return FailureRepro(
        "fp8",
        what,
        code,
        f"exact, up to chance: a correct rounding fails the first two with chance (1/2)^{draws - 1} and "
        f"(1/2)^{draws}, the third never",
        {"x": x},
        needs=("torch", "torchao"),
    )


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


def e8m0_outcomes(what: str, cases: Sequence[tuple[str, float, int]], device: str = "cpu") -> FailureRepro:
    """torch's float32 -> e8m0 cast of the values whose code left this stack's golden table (ties,
    zero, sign, overflow: what the format leaves open), each against the code the table holds."""
    rows = "".join(f"\n    ({name!r}, {float_src(x)}, {code})," for name, x, code in cases)
    code = FORMAT_CODES.fill("e8m0_outcomes", values={"CASES": f"[{rows}\n]", "DEVICE": repr(device)})
    return FailureRepro("formats", what, code, "exact: the golden table of this torch release", device=device)


def fp4_casts(what: str, values: torch.Tensor) -> FailureRepro:
    """torchao's e2m1 (fp4) kernels, the casts MX training uses: decode of all 16 codes against the
    bit layout, and float32 -> e2m1 of ``values`` against round-to-nearest-even in exact rationals,
    saturating beyond the largest value (the format has no inf or NaN)."""
    code = FORMAT_CODES.fill("torchao", "fp4")
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
    product: tuple[str, Mapping[str, str]],
    tensors: Mapping[str, torch.Tensor],
    bound: torch.Tensor,
    floor_db: float,
    origin: str,
    *,
    needs: tuple[str, ...] = ("torch",),
    device: str = "cpu",
) -> FailureRepro:
    """A low-precision matrix product (``product``: the block of ``scripts/products.py`` that makes
    it, and its values) held to an element-wise ``bound`` (saved) and an SQNR floor, both derived
    by the check from the operands' formats and scales, against the product in float64."""
    block, values = product
    # without the output gradient saved, the forward's product is the only one the script can judge
    reference = "reference" if "go" in tensors else "reference_output"
    code = PRODUCTS.fill("parameters", block, reference, "judgement", values={**values, "FLOOR_DB": repr(floor_db)})
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
