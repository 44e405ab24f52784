"""Fp8 scaling code against the specification: the one comparison the scaling suite and users'
own tests make (``harness.api.check_fp8_scaling``).

Example, in a test of your own::

    from hypothesis import given, strategies as st
    from harness.api import CastSpec, Granularity, check_fp8_scaling
    from harness.numerics.formats import FP8_E4M3FN

    @given(rows=st.lists(st.lists(st.floats(-1e4, 1e4, width=32), min_size=4, max_size=4), min_size=1))
    def test_my_rowwise_scaling(rows):
        result = check_fp8_scaling(MyScaling(), rows, CastSpec(FP8_E4M3FN, Granularity.AXIS, -1, power_of_2=True))
        assert result.passed, result.explain()
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from harness.domains.fp8.adapters import Fp8Scaling
from harness.numerics.formats import tensor_bits
from harness.numerics.scaled import CastSpec, Granularity, near_power_of_2, quantize, scales


@dataclass(frozen=True)
class ScalingCheck:
    """What an adapter did on one tensor: the mismatches against the reference (scales and cast
    bits), and how many scales differed only as the registered power-of-two finding explains."""

    spec: CastSpec
    rows: int
    cols: int
    problems: tuple[str, ...] = ()
    explained: int = 0
    elements: int = field(default=0)
    #: how many of the problems are scales (the rest: shapes, cast bits)
    scale_problems: int = 0

    @property
    def passed(self) -> bool:
        return not self.problems

    def explain(self) -> str:
        shown = "; ".join(self.problems[:4])
        more = f" (and {len(self.problems) - 4} more)" if len(self.problems) > 4 else ""
        return f"{self.spec.describe()} on a {self.rows}x{self.cols} tensor: {shown}{more}"


def scale_shape(rows: int, cols: int, spec: CastSpec) -> tuple[int, int]:
    """The shape the spec's scales broadcast from: one, one per row, or one per column."""
    if spec.granularity is Granularity.TENSOR:
        return (1, 1)
    return (rows, 1) if spec.axis in (-1, 1) else (1, cols)


def explained_pow2_deviation(spec: CastSpec, got: float, exact: float, unrounded: float) -> bool:
    """A power-of-two scale one binade high, with the unrounded scale inside float32 log2's window
    below that power of two: the registered finding ``torchao-pow2-scale-rounds-up``, not a fault."""
    return spec.power_of_2 and got == 2 * exact and near_power_of_2(unrounded)


def check_fp8_scaling(
    adapter: Fp8Scaling, rows: Sequence[Sequence[float]], spec: CastSpec, device: torch.device | str = "cpu"
) -> ScalingCheck:
    """Scales and cast bits of ``adapter`` on the 2-D tensor ``rows`` against the exact reference."""
    x = torch.tensor([list(r) for r in rows], dtype=torch.float32, device=device)
    n, m = x.shape
    s = adapter.scale(x, spec).detach()
    want_shape = scale_shape(n, m, spec)
    got_shape = tuple(s.shape)
    if s.numel() != want_shape[0] * want_shape[1] or (s.dim() == 2 and got_shape != want_shape):
        problem = f"scales of shape {got_shape}, expected {want_shape} ({spec.describe()})"
        return ScalingCheck(spec, n, m, (problem,), elements=n * m)
    got = s.to(torch.float32).reshape(want_shape).expand(n, m).flatten().cpu().tolist()
    exact_spec = CastSpec(spec.fmt, spec.granularity, spec.axis, power_of_2=False)
    ref = torch.tensor(scales(x.tolist(), spec), dtype=torch.float32).reshape(want_shape).expand(n, m)
    unrounded = torch.tensor(scales(x.tolist(), exact_spec), dtype=torch.float32).reshape(want_shape).expand(n, m)
    problems: list[str] = []
    explained = 0
    for i, (g, r, u) in enumerate(zip(got, ref.flatten().tolist(), unrounded.flatten().tolist(), strict=True)):
        if g == r or (math.isnan(g) and math.isnan(r)):
            continue
        if explained_pow2_deviation(spec, g, r, u):
            explained += 1
            continue
        problems.append(f"scale of element {i}: expected {r!r}, got {g!r}")
    scale_problems = len(problems)
    bits = tensor_bits(adapter.cast(x, s, spec))
    for v, sc, b in zip(x.flatten().cpu().tolist(), got, bits, strict=True):
        want = quantize(v, sc, spec.fmt)
        if b != want and not (spec.fmt.is_nan_bits(b) and spec.fmt.is_nan_bits(want)):
            problems.append(
                f"cast of {v!r} x scale {sc!r}: expected {spec.fmt.name} {want:#04x} ({spec.fmt.decode(want)!r}), "
                f"got {b:#04x} ({spec.fmt.decode(b)!r})"
            )
    return ScalingCheck(spec, n, m, tuple(problems), explained, n * m, scale_problems)
