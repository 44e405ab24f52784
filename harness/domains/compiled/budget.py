"""How far compiled AMP may stray from float64, relative to eager AMP: a budget derived from the
format's unit roundoff, propagated through the probe block in float64.

Eager and compiled AMP evaluate the same graph under the same autocast policy; they differ in
*where they round*. Eager rounds every op's output to the autocast dtype; Inductor fuses ops and may
keep a fused intermediate in float32 (eliding a down/up-cast pair), or round twice where eager
rounds once (a matmul rounded before its bias is added). Each such difference is at most one
low-precision rounding at an op boundary: ``|r_j| <= u |v_j|`` at stage ``j``. Its effect on a
later quantity ``m`` (a stage output or a gradient) is measured, not guessed: the float64
reference is rerun with exactly that rounding applied at ``j`` (forward), or applied to the
gradient flowing back through ``j`` (backward), and ``m`` moves by ``d_m(j)``. A correct compiled
evaluation then satisfies, to first order (the triangle inequality over boundaries)::

    |compiled_m - ref_m| <= |eager_m - ref_m| + sum_j d_m(j) + rounding of m itself
                          + gamma_n(u_fp32) |ref_m|      (fp32 accumulation in a different order)

with ``n`` the longest reduction in the block. Dynamo's own accuracy check (``same()``) instead
multiplies eager's RMSE by hand-tuned factors; here every term has a derivation. All errors are
max-norms, relative to ``max |ref_m|``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from harness.domains.compiled.probe import (
    LONGEST_REDUCTION,
    STAGE_NAMES,
    Forward,
    Observation,
    call_block,
    float64_copy,
    observe,
)
from harness.domains.engines.ops.probe import dtype_name
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP32, FloatFormat, format_of
from harness.numerics.tolerance import gamma


def _rounding(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The error of rounding float64 ``v`` to ``dtype`` once (what one extra or one elided cast
    changes at that point)."""
    return v.to(dtype).to(v.dtype) - v


class _RoundGradient(torch.autograd.Function):
    """Identity forward; backward adds the error of rounding the incoming gradient to ``dtype``."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        ctx.dtype = dtype  # type: ignore[attr-defined]
        return v.view_as(v)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, g: torch.Tensor) -> tuple[torch.Tensor, None]:
        return g + _rounding(g, ctx.dtype), None  # type: ignore[attr-defined]


def _max_abs(t: torch.Tensor) -> float:
    return float(t.double().abs().max()) if t.numel() else 0.0


@dataclass(frozen=True)
class Budget:
    """Per quantity (``forward.<stage>``, ``grad.<parameter>``): the float64 reference's scale
    (max |ref|), and the allowance on top of eager's error, relative to that scale, with its terms."""

    dtype: str
    scale: Mapping[str, float]
    allowance: Mapping[str, float]
    #: per quantity, the boundary contributing most, for the explanation
    largest_term: Mapping[str, str]


def derive(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    dtype: torch.dtype,
    forward: Forward = call_block,
    stages: Sequence[str] = STAGE_NAMES,
    longest_reduction: int = LONGEST_REDUCTION,
    round_as: Mapping[str, torch.dtype] | None = None,
) -> tuple[Observation, Budget]:
    """The float64 reference of ``forward`` (the probe block unless another program with ``tap``
    points at ``stages`` is given) and the budget of every quantity for ``dtype``. ``round_as``:
    the format each stage's boundary rounds to where it is not ``dtype`` (a stage autocast keeps in
    fp32 rounds at fp32: a compiler that rounds it lower is what the check is for)."""
    low: FloatFormat = format_of(dtype)
    m64 = float64_copy(model)
    x64 = x.detach().double()
    ref = observe(forward, m64, x64, y, None)
    base = ref.values()
    scale = {k: _max_abs(v) for k, v in base.items()}
    total = {k: 0.0 for k in base}
    largest: dict[str, tuple[float, str]] = {k: (0.0, "") for k in base}
    for stage in stages:
        at = (round_as or {}).get(stage, dtype)
        for direction in ("forward", "backward"):

            def tap(
                name: str, v: torch.Tensor, _s: str = stage, _d: str = direction, _at: torch.dtype = at
            ) -> torch.Tensor:
                if name != _s:
                    return v
                if _d == "forward":
                    return v + _rounding(v.detach(), _at)
                return _RoundGradient.apply(v, _at)  # type: ignore[no-any-return, no-untyped-call]

            moved = observe(forward, m64, x64, y, None, tap).values()
            for k, v in moved.items():
                d = _max_abs(v - base[k]) / scale[k] if scale[k] > 0 else 0.0
                total[k] += d
                if d > largest[k][0]:
                    largest[k] = (d, f"{direction} rounding at {stage}")
    accumulation = gamma(longest_reduction, FP32.unit_roundoff)
    allowance = {}
    for k in base:
        own = low.unit_roundoff if k.startswith("grad.") else 0.0  # forward stages: counted at their own boundary
        allowance[k] = total[k] + own + accumulation
    return ref, Budget(dtype_name(dtype), scale, allowance, {k: v[1] for k, v in largest.items()})


def relative_error(obs: Observation, ref: Observation, budget: Budget) -> dict[str, float]:
    """max |obs - ref| / max |ref| per quantity."""
    rv = ref.values()
    return {
        k: (_max_abs(v.double() - rv[k]) / budget.scale[k] if budget.scale[k] > 0 else _max_abs(v.double()))
        for k, v in obs.values().items()
    }


@dataclass(frozen=True)
class NumericsResult:
    """Compiled against eager, both against float64, per quantity, for one dtype and variant."""

    variant: str
    eager: Mapping[str, float]
    compiled: Mapping[str, float]
    budget: Budget

    @property
    def dtype(self) -> str:
        return self.budget.dtype

    def ratio(self, k: str) -> float:
        """How much of its allowance the compiled error's excess over eager's uses (<= 1 passes)."""
        excess = self.compiled[k] - self.eager[k]
        return excess / self.budget.allowance[k]

    def worst(self) -> str:
        return max(self.compiled, key=self.ratio)

    def claim(self) -> ClaimComparison:
        worst = self.worst()
        failing = [k for k in self.compiled if self.ratio(k) > 1.0]
        return compare_claim(
            f"compiled.{self.variant}.{self.dtype}.error_over_budget",
            self.ratio(worst),
            not failing,
            "every stage and gradient: |compiled - fp64| <= |eager - fp64| + the budget of one low-precision "
            "rounding per op boundary, propagated in fp64 (harness/domains/compiled/budget.py); max-norms relative "
            "to max |fp64|",
            detail=tuple(self.explain(k) for k in failing),
            allowance=1.0,
        )

    def explain(self, k: str) -> str:
        b = self.budget
        return (
            f"{k} ({self.dtype}, {self.variant}): compiled error {self.compiled[k]:.3g} vs eager {self.eager[k]:.3g} "
            f"(relative to max|fp64| {b.scale[k]:.3g}): excess {self.compiled[k] - self.eager[k]:.3g} > budget "
            f"{b.allowance[k]:.3g} ({self.ratio(k):.2f}x; largest term: {b.largest_term[k]})"
        )


def judge(variant: str, eager: Observation, compiled: Observation, ref: Observation, budget: Budget) -> NumericsResult:
    """Eager and compiled against the float64 reference ``ref``, under the ``budget`` derived with it."""
    return NumericsResult(
        variant,
        relative_error(eager, ref, budget),
        relative_error(compiled, ref, budget),
        budget,
    )
