"""Python scalars meeting an autocast region's low-precision output, compiled as eager runs them.

Eager CPU rounds a Python float operand to the tensor's dtype before comparing, adding,
subtracting or taking a remainder (``x > 1.7`` on bf16 compares with 1.703125). A compiler that
keeps the scalar unrounded in its fp32 compute type gives other answers exactly where it matters:
at the scalar's rounding, a threshold lets an element through, a loss's clamp drops its gradient
(pytorch/pytorch#185517: ``margin_ranking_loss`` gradients silently zeroed), a remainder jumps by a
whole modulus. Tolerance-based numerics on random inputs never land there; these cases do.

Each case is an op on the autocast region's output (``h = x @ I`` under autocast: ``x``'s values,
in the autocast dtype), with inputs placed at the rounded scalar ``r = round(S)``. The compiled
program is held to eager's value exactly (eager is the other implementation of the same program).
Which rule eager followed is read off float64 arithmetic (Python floats, the format's rounding by
arithmetic: :func:`harness.numerics.rounding.round_to_format`), never torch's ops, and recorded:
eager's rule is torch's to change (2.14 changed what a loss's clamp does at its boundary), the
agreement of compiled and eager is the claim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.engines.compiler.compiling import Backend, compile_fn
from harness.numerics.comparison import ElementwiseComparison, compare_values
from harness.numerics.formats import format_of
from harness.numerics.rounding import round_to_format
from harness.numerics.tolerance import Tolerance

#: The scalar: not representable in bf16 or fp16, and rounded up in both (1.703125 and
#: 1.7001953125), so an unrounded scalar moves each case's boundary the same way in both formats.
S = 1.7

#: the known issue covering each case's kind of op (compiled/known_issues.py)
COMPARISON = "inductor-cpu-unrounded-scalar-comparisons"
ADD_SUB = "inductor-cpu-unrounded-scalar-add-sub"
FMOD_REMAINDER = "inductor-cpu-unrounded-scalar-fmod-remainder"


#: the registered issues, one per kind of op (CUDA eager adds in fp32 opmath with the scalar as
#: given, where CPU eager rounds it: pytorch/pytorch#185869 keeps Inductor's rounding CPU-only)
ISSUES = (COMPARISON, ADD_SUB, FMOD_REMAINDER)

#: what a case is held to, and why exactly
RULE = Tolerance(0.0, 0.0, "exact: eager's value, the same program uncompiled (a mask or a remainder has no slack)")


@dataclass(frozen=True)
class Case:
    """One op on the region's output: what it computes, the element of the program's input it
    reads (at ``r`` times ``factor``), whether it is judged by a value or by the gradient it sends
    back, and its value in float64 from the input and a scalar."""

    name: str
    does: str
    issue: str
    factor: float
    expected: Callable[[float, float], float]
    grad: bool = False


CASES: tuple[Case, ...] = (
    Case("gt", "h > S (a threshold on an activation)", COMPARISON, 1.0, lambda x, r: float(x > r)),
    Case("eq", "h == S", COMPARISON, 1.0, lambda x, r: float(x == r)),
    Case("sub_relu_mask", "relu(h - S) > 0", ADD_SUB, 1.0, lambda x, r: float(x - r > 0)),
    Case(
        "clamp_add_grad",
        "gradient of clamp_min(h + S, 0).sum() (clamp passes the boundary's gradient)",
        ADD_SUB,
        -1.0,
        lambda x, r: float(x + r >= 0),
        grad=True,
    ),
    Case(
        "margin_ranking_grad",
        "gradient of margin_ranking_loss(h, 0, 1, margin=S) w.r.t. h",
        ADD_SUB,
        1.0,
        lambda x, r: -float(-(x - 0.0) + r >= 0),
        grad=True,
    ),
    Case("fmod", "fmod(h, S)", FMOD_REMAINDER, 2.0, lambda x, r: math.fmod(x, r)),
    Case("remainder", "remainder(h, S)", FMOD_REMAINDER, -2.0, lambda x, r: x % r),
)
BY_NAME = {c.name: c for c in CASES}


def rounded_scalar(dtype: torch.dtype) -> float:
    """``S`` rounded to ``dtype`` by arithmetic (never a torch cast)."""
    return float(round_to_format(torch.tensor([S], dtype=torch.float64), format_of(dtype))[0])


def inputs(dtype: torch.dtype) -> list[float]:
    """The program's input: each case's element, at the rounded scalar times its factor (exact in
    the format: a power of two times a value of it)."""
    r = rounded_scalar(dtype)
    return [c.factor * r for c in CASES]


def _program(dtype: torch.dtype) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, ...]]:
    """The user's code: a matmul under autocast, then a scalar op per case on its output (outside
    the region, as post-processing and losses often are); a case judged by gradient returns the
    loss it backpropagates."""
    f = torch.nn.functional

    def program(x: torch.Tensor, eye: torch.Tensor) -> tuple[torch.Tensor, ...]:
        with torch.autocast(x.device.type, dtype=dtype):
            h = (x[None, :] @ eye)[0]  # x's values, in the autocast dtype
        g = {c.name: h[i : i + 1] for i, c in enumerate(CASES)}
        zero, one = torch.zeros_like(g["margin_ranking_grad"]), torch.ones_like(g["margin_ranking_grad"])
        return (
            (g["gt"] > S).to(dtype),
            (g["eq"] == S).to(dtype),
            (torch.relu(g["sub_relu_mask"] - S) > 0).to(dtype),
            torch.clamp_min(g["clamp_add_grad"] + S, 0).sum(),
            f.margin_ranking_loss(g["margin_ranking_grad"], zero, one, margin=S),
            torch.fmod(g["fmod"], S),
            torch.remainder(g["remainder"], S),
        )

    return program


@dataclass(frozen=True)
class Observed:
    """What one run (eager or compiled) gave for each case (a value, or a gradient), or the error
    that stopped it."""

    values: dict[str, float]
    error: str | None = None


def observe(device: torch.device, dtype: torch.dtype, backend: Backend | None) -> Observed:
    """Run the program eagerly (``backend`` None) or compiled with ``backend``; each case's value or
    gradient."""
    program = _program(dtype)
    run: Callable[..., Any] = program if backend is None else compile_fn(program, backend)
    x = torch.tensor(inputs(dtype), dtype=torch.float32, device=device, requires_grad=True)
    eye = torch.eye(len(CASES), dtype=torch.float32, device=device)
    try:
        outs = run(x, eye)
        losses = [o for c, o in zip(CASES, outs, strict=True) if c.grad]
        (grad,) = torch.autograd.grad(sum(losses), x)
    except Exception as exc:  # a compiler that cannot build the program: every case fails, saying why
        return Observed({}, f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}")
    values = {
        c.name: float(grad[i]) if c.grad else float(outs[i].detach().float().reshape(-1)[0])
        for i, c in enumerate(CASES)
    }
    return Observed(values)


class ScalarRuns:
    """The program's eager and compiled runs on one device with one backend, each dtype's made
    once and shared by every case's check (one compile per dtype)."""

    def __init__(self, device: torch.device, backend: Backend) -> None:
        self.device, self.backend = device, backend
        self._seen: dict[tuple[torch.dtype, bool], Observed] = {}

    def eager(self, dtype: torch.dtype) -> Observed:
        return self._get(dtype, compiled=False)

    def compiled(self, dtype: torch.dtype) -> Observed:
        return self._get(dtype, compiled=True)

    def _get(self, dtype: torch.dtype, compiled: bool) -> Observed:
        if (dtype, compiled) not in self._seen:
            self._seen[dtype, compiled] = observe(self.device, dtype, self.backend if compiled else None)
        return self._seen[dtype, compiled]


def rules(case: str, dtype: torch.dtype) -> dict[str, float]:
    """The case's value under each rule eager has had for the scalar, from float64 arithmetic:
    ``rounded`` (the scalar rounded to the tensor's dtype: CPU add, sub, comparisons, fmod and
    remainder up to now) and ``fp32`` (the scalar as an fp32 value in fp32 opmath: CUDA's add)."""
    c = BY_NAME[case]
    r, s32 = rounded_scalar(dtype), float(torch.tensor(S, dtype=torch.float32).item())
    fmt = format_of(dtype)

    def value(s: float) -> float:
        return float(round_to_format(torch.tensor([c.expected(c.factor * r, s)], dtype=torch.float64), fmt)[0])

    return {"rounded": value(r), "fp32": value(s32)}


def eager_rule(case: str, dtype: torch.dtype, value: float) -> str:
    """Which rule eager's ``value`` follows ("rounded", "fp32", both or neither): a row's tag, so a
    release that changes eager's rule shows in a diff of two stacks' reports."""
    matched = [k for k, v in rules(case, dtype).items() if v == value]
    return "+".join(matched) or "neither"


def judge(case: str, dtype: torch.dtype, compiled: Observed, eager: Observed) -> ElementwiseComparison:
    """The claim: the compiled program gives eager's value for the case, exactly (eager is another
    implementation of the same program; the float64 rules in the label say what each value means)."""
    c = BY_NAME[case]
    r = rounded_scalar(dtype)
    rule = ", ".join(f"{k} rule {v!r}" for k, v in rules(case, dtype).items())
    label = f"compiled {c.does} at input {c.factor * r!r}, {str(dtype).removeprefix('torch.')}, S = {S} ({rule})"
    if eager.error is not None:
        return compare_values(f"{label} (eager raised {eager.error})", [math.nan], [math.nan], RULE)
    want = eager.values[case]
    if compiled.error is not None:
        return compare_values(f"{label} (it raised {compiled.error})", [math.nan], [want], RULE)
    return compare_values(label, [compiled.values[case]], [want], RULE, inputs=[c.factor * r])
