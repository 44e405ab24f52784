"""The formats family's reproductions: torch's casts against round-to-nearest-even in exact
rationals, a format's limits from its bits, and torch's values against their sources. The scripts
are the blocks of ``scripts/formats.py``, with the check's values written in."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src, float_src
from harness.numerics.formats import format_of

#: the formats' claims, standalone: ``scripts/formats.py``
FORMATS = ScriptTemplate(__package__ or "harness.domains.formats", "formats")


def cast_rounding(what: str, values: torch.Tensor, dtype: torch.dtype) -> FailureRepro:
    """torch's cast of float32 ``values`` to ``dtype`` against round-to-nearest-even written out in
    exact rationals from the format's precision, minimum exponent and largest finite value (values
    the format leaves to the implementation, overflow without inf, are not among them)."""
    fmt = format_of(dtype)
    values_src = {
        "DTYPE": dtype_src(dtype),
        "P": repr(fmt.precision),
        "EMIN": repr(fmt.emin),
        "MAX": repr(fmt.max),
        "IEEE": repr(fmt.encoding.value == "ieee"),
    }
    code = FORMATS.fill("cast_rounding", values=values_src)
    return FailureRepro("formats", what, code, "exact: IEEE 754 round-to-nearest-even", {"x": values})


def format_limits(what: str, fmt_name: str, names: Sequence[str]) -> FailureRepro:
    """``torch.finfo``'s limits of a format against the same limits computed from its bit layout
    (exponent and mantissa widths, bias, and which all-ones patterns are not finite)."""
    fmt = format_of(fmt_name)
    values = {
        "DTYPE": f"torch.{fmt.name}",
        "EB": repr(fmt.exponent_bits),
        "MB": repr(fmt.mantissa_bits),
        "IEEE": repr(fmt.encoding.value == "ieee"),
        "NAMES": repr(list(names)),
    }
    code = FORMATS.fill("format_limits", values=values)
    return FailureRepro("formats", what, code, "exact: a format's limits follow from its bit layout")


def torch_values(what: str, cases: Sequence[tuple[str, str, float]], origin: str) -> FailureRepro:
    """torch expressions (source text) against the exact values a check expected of them."""
    rows = "".join(f"\n    ({name!r}, lambda: {src}, {float_src(expected)})," for name, src, expected in cases)
    code = FORMATS.fill("torch_values", values={"CASES": f"[{rows}\n]"})
    return FailureRepro("formats", what, code, origin)


def cast_outcomes(what: str, cases: Sequence[tuple[str, float, str]], device: str = "cpu") -> FailureRepro:
    """torch's cast of float32 values to fp8 formats, each result described as the check describes
    it (``max``, ``-max``, ``inf``, ``nan`` or the value), against the expected description."""
    rows = "".join(f"\n    ({name!r}, {float_src(x)}, {exp!r})," for name, x, exp in cases)
    code = FORMATS.fill("cast_outcomes", values={"OUTCOMES": f"[{rows}\n]", "DEVICE": repr(device)})
    return FailureRepro("formats", what, code, "exact", device=device)
