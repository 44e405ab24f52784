"""The fp8 family's reproductions: scales, codes, e8m0 and fp4 casts against their exact
definitions (a float8 linear's products against float64 are :mod:`harness.domains.engines.scaled`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src, float_src
from harness.numerics.formats import format_of
from harness.numerics.scaled import CastSpec, Granularity

#: the family's scripts, each a file of ``scripts/``
FP8_SCALES = ScriptTemplate(__package__ or "harness.domains.fp8", "fp8_scales")
FORMAT_CODES = ScriptTemplate(__package__ or "harness.domains.fp8", "format_codes")
#: a recipe's casts against its specification: ``scripts/recipe_casts.py``
RECIPE_CASTS = ScriptTemplate(__package__ or "harness.domains.fp8", "recipe_casts")
#: float8 all-gather under FSDP2 on forked gloo ranks: ``scripts/all_gather.py``
ALL_GATHER = ScriptTemplate(__package__ or "harness.domains.fp8", "all_gather")


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


def float8_all_gather(what: str, world: int, shard: str, steps: int, emulate: bool) -> FailureRepro:
    """torchao's float8 MLP under FSDP2 (``shard``: ``module:function``, torch's ``fully_shard`` or
    yours) on ``world`` ranks forked over gloo, without and with float8 all-gather: bit for bit."""
    values = {"WORLD": repr(world), "SHARD": repr(shard), "STEPS": repr(steps), "EMULATE": repr(emulate)}
    code = ALL_GATHER.fill(
        "prelude", "float8_all_gather", "launch", "float8_all_gather_reference", "verdict", values=values
    )
    needs = sorted({"torch", "torchao", shard.partition(":")[0].split(".")[0]})
    return FailureRepro(
        "fp8", what, code, "exact: torchao promises identical numerics with float8 all-gather", needs=tuple(needs)
    )


def recipe_casts(name: str, spec: Mapping[tuple[str, str], CastSpec | None]) -> FailureRepro:
    """torchao's ``Float8LinearConfig.from_recipe_name(name)`` against the recipe's specification
    ``spec`` (each operand's cast: format, one scale per tensor or along an axis, power of two)."""
    written = {
        key: None
        if cast is None
        else (cast.fmt.short, "tensor" if cast.granularity is Granularity.TENSOR else cast.axis, cast.power_of_2)
        for key, cast in spec.items()
    }
    values = {"RECIPE": repr(name), "SPEC": repr(written)}
    code = RECIPE_CASTS.fill("parameters", "casts", values=values)
    what = f"torchao's {name} recipe: operands cast unlike the specification"
    return FailureRepro("fp8", what, code, "exact: the recipe's specification", needs=("torch", "torchao"))
