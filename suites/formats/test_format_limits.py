"""Claim family: the limits of each format follow from its bit layout, and torch agrees.

The reference limits are computed with integer bit manipulation (:mod:`harness.numerics.formats`), never
read from ``torch.finfo``; both are recorded, compared exactly, and the table is a universal
baseline (a format's limits do not depend on the machine or the release).
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.formats.repro import format_limits
from harness.numerics.comparison import compare_scalar
from harness.numerics.formats import FORMATS, FloatFormat, torch_dtype
from harness.numerics.tolerance import EXACT
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("formats")

FINFO_NAMES = {
    "max": "max",
    "smallest_normal": "smallest_normal",
    "eps": "eps",
    "unit_roundoff": None,
    "smallest_subnormal": None,
}


@pytest.mark.amp_quick
@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=lambda f: f.short)
def test_limits_from_the_bit_layout_match_torch_finfo(fmt: FloatFormat, amp_record):
    finfo = torch.finfo(torch_dtype(fmt))
    torch_values = {
        "max": float(finfo.max),
        "smallest_normal": float(finfo.smallest_normal),
        "eps": float(finfo.eps),
        # finfo has no subnormal field: the smallest subnormal is smallest_normal * 2^-mantissa_bits
        "smallest_subnormal": float(finfo.smallest_normal) * 2.0 ** -(finfo.bits - 1 - _exponent_bits(finfo)),
        "unit_roundoff": float(finfo.eps) / 2,
    }
    amp_record.require_all(
        [
            compare_scalar(f"{fmt.name}.{name}", torch_values[name], reference, EXACT)
            for name, reference in fmt.limits().items()
        ],
        dtype=fmt.name,
        tags={"reference": "bit layout"},
        repro_of=lambda r: format_limits(
            f"torch.finfo({fmt.name}) against its bit layout", fmt.name, [r.name.rpartition(".")[2]]
        ),
    )


def _exponent_bits(finfo: torch.finfo) -> int:
    """Exponent width from finfo alone: max is about 2^(2^(e-1)), so e = log2(log2(max)) + 1."""
    import math

    return round(math.log2(math.log2(float(finfo.max)))) + 1


def test_format_limits_table_matches_the_universal_baseline(amp_baseline):
    table = {
        fmt.name: {
            **fmt.limits(),
            "precision_bits": fmt.precision,
            "exponent_bits": fmt.exponent_bits,
            "decimal_digits": round(fmt.decimal_digits, 6),
            "overflow_threshold": fmt.overflow_threshold,
        }
        for fmt in FORMATS.values()
    }
    amp_baseline.check("limits", table, key=KeyKind.UNIVERSAL)
