"""Comparisons as pure functions returning results, and the one place that explains them.

Modelled on ``torch.testing._comparison``: a comparison never raises or prints; it returns a
frozen result whose ``passed`` says the verdict, and :func:`explain` turns any result into the
message a failing test shows ("Mismatched elements: 2 / 3 (66.7%) ... (up to 1e-05 allowed)").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from harness.numerics.formats import FloatFormat
from harness.numerics.tolerance import EXACT, Tolerance

if TYPE_CHECKING:
    import torch

#: How many individual mismatches a message lists before summarising.
SHOWN_MISMATCHES = 5


class Comparison(Protocol):
    name: str

    @property
    def passed(self) -> bool: ...


@dataclass(frozen=True)
class ScalarComparison:
    """``actual`` against ``expected`` within a tolerance."""

    name: str
    actual: float
    expected: float
    tolerance: Tolerance
    unit: str = ""

    @property
    def abs_diff(self) -> float:
        return abs(self.actual - self.expected)

    @property
    def allowed(self) -> float:
        return self.tolerance.allowed(self.expected)

    @property
    def passed(self) -> bool:
        return self.tolerance.allows(self.actual, self.expected)


@dataclass(frozen=True)
class BoundComparison:
    """A measured value against an upper bound (an error budget)."""

    name: str
    value: float
    bound: float
    origin: str
    unit: str = ""

    @property
    def passed(self) -> bool:
        return not math.isnan(self.value) and self.value <= self.bound


@dataclass(frozen=True)
class Mismatch:
    index: int
    expected: Any
    actual: Any
    input: Any = None
    detail: str = ""


@dataclass(frozen=True)
class ElementwiseComparison:
    """Many values compared one by one (elements of a tensor, examples of a property)."""

    name: str
    total: int
    mismatches: tuple[Mismatch, ...]
    criterion: str
    mismatch_count: int = -1
    max_abs_diff: float | None = None
    max_abs_diff_index: int | None = None

    @property
    def count(self) -> int:
        return len(self.mismatches) if self.mismatch_count < 0 else self.mismatch_count

    @property
    def passed(self) -> bool:
        return self.count == 0


@dataclass(frozen=True)
class DataDifference:
    path: str
    expected: Any
    actual: Any
    reason: str


@dataclass(frozen=True)
class DataComparison:
    """Nested data (a baseline) compared leaf by leaf."""

    name: str
    total_leaves: int
    differences: tuple[DataDifference, ...]
    tolerance: Tolerance = field(default=EXACT)

    @property
    def passed(self) -> bool:
        return not self.differences


AnyComparison = ScalarComparison | BoundComparison | ElementwiseComparison | DataComparison


# -- comparisons ------------------------------------------------------------------------------
def compare_scalar(name: str, actual: float, expected: float, tolerance: Tolerance, unit: str = "") -> ScalarComparison:
    return ScalarComparison(name, float(actual), float(expected), tolerance, unit)


def compare_bound(name: str, value: float, bound: float, origin: str, unit: str = "") -> BoundComparison:
    return BoundComparison(name, float(value), float(bound), origin, unit)


def compare_values(
    name: str,
    actual: Sequence[float],
    expected: Sequence[float],
    tolerance: Tolerance,
    inputs: Sequence[Any] | None = None,
) -> ElementwiseComparison:
    if len(actual) != len(expected):
        raise ValueError(f"{name}: {len(actual)} actual values against {len(expected)} expected")
    bad: list[Mismatch] = []
    worst, worst_i = 0.0, None
    for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
        if not tolerance.allows(a, e):
            bad.append(Mismatch(i, e, a, None if inputs is None else inputs[i]))
        if math.isfinite(a) and math.isfinite(e) and abs(a - e) >= worst:
            worst, worst_i = abs(a - e), i
    return ElementwiseComparison(
        name, len(actual), tuple(bad), tolerance.describe(), max_abs_diff=worst, max_abs_diff_index=worst_i
    )


def compare_bits(
    name: str,
    actual_bits: Sequence[int],
    expected_bits: Sequence[int | None],
    fmt: FloatFormat,
    inputs: Sequence[float] | None = None,
) -> ElementwiseComparison:
    """Bit patterns equal (any NaN equals any NaN; ``None`` expected means 'not defined')."""
    bad: list[Mismatch] = []
    for i, (a, e) in enumerate(zip(actual_bits, expected_bits, strict=True)):
        if e is None or a == e or (fmt.is_nan_bits(a) and fmt.is_nan_bits(e)):
            continue
        detail = f"{fmt.name} bits: expected value {fmt.decode(e):.9g}, got {fmt.decode(a):.9g}"
        bad.append(Mismatch(i, e, a, None if inputs is None else inputs[i], detail))
    return ElementwiseComparison(name, len(actual_bits), tuple(bad), f"bitwise equal to the {fmt.name} reference")


def compare_predicate(
    name: str,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    predicate: Callable[[Any, Any], bool],
    criterion: str,
    expected: Sequence[Any] | None = None,
) -> ElementwiseComparison:
    """Each output must satisfy ``predicate(input, output)``, or with ``expected`` given,
    ``predicate(output, expected)`` (then mismatches show the expected value)."""
    bad: list[Mismatch] = []
    for i, (x, o) in enumerate(zip(inputs, outputs, strict=True)):
        if expected is None:
            if not predicate(x, o):
                bad.append(Mismatch(i, None, o, x, "violates the criterion"))
        elif not predicate(o, expected[i]):
            bad.append(Mismatch(i, expected[i], o, x))
    return ElementwiseComparison(name, len(inputs), tuple(bad), criterion)


def compare_tensors(
    name: str, actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance
) -> ElementwiseComparison:
    """Elementwise ``|a - e| <= atol + rtol |e|`` computed in float64, NaN equal to NaN."""
    import torch

    if actual.shape != expected.shape:
        raise ValueError(f"{name}: shape {tuple(actual.shape)} against {tuple(expected.shape)}")
    a = actual.detach().to("cpu", torch.float64).flatten()
    e = expected.detach().to("cpu", torch.float64).flatten()
    diff = (a - e).abs()
    allowed = tolerance.atol + tolerance.rtol * e.abs()
    both_nan = a.isnan() & e.isnan()
    same_inf = torch.isinf(a) & (a == e)
    ok = both_nan | same_inf | (diff <= allowed)
    bad_idx = (~ok).nonzero().flatten().tolist()
    finite = torch.where(torch.isfinite(diff), diff, torch.zeros_like(diff))
    worst_i = int(finite.argmax()) if finite.numel() else None
    shown = tuple(Mismatch(i, float(e[i]), float(a[i])) for i in bad_idx[:SHOWN_MISMATCHES])
    return ElementwiseComparison(
        name,
        int(a.numel()),
        shown,
        tolerance.describe(),
        mismatch_count=len(bad_idx),
        max_abs_diff=None if worst_i is None else float(finite[worst_i]),
        max_abs_diff_index=worst_i,
    )


def compare_within(
    name: str, actual: torch.Tensor, reference: torch.Tensor, bound: torch.Tensor, origin: str
) -> ElementwiseComparison:
    """Elementwise ``|actual - reference| <= bound`` (an error budget per element), in float64.

    ``max_abs_diff`` holds the worst ratio error/budget (1.0 is the edge of the budget).
    """
    import torch

    a = actual.detach().to("cpu", torch.float64).flatten()
    r = reference.detach().to("cpu", torch.float64).flatten()
    b = bound.detach().to("cpu", torch.float64).expand_as(reference).flatten()
    err = (a - r).abs()
    err = torch.where(a.isnan() | r.isnan(), torch.full_like(err, math.inf), err)
    ratio = err / b.clamp_min(torch.finfo(torch.float64).tiny)
    bad_idx = (~(err <= b)).nonzero().flatten().tolist()
    worst_i = int(ratio.argmax()) if ratio.numel() else None
    shown = tuple(
        Mismatch(i, float(r[i]), float(a[i]), None, f"budget {float(b[i]):.3g}") for i in bad_idx[:SHOWN_MISMATCHES]
    )
    return ElementwiseComparison(
        name,
        int(a.numel()),
        shown,
        f"|autocast - float64 reference| <= budget: {origin}",
        mismatch_count=len(bad_idx),
        max_abs_diff=None if worst_i is None else float(ratio[worst_i]),
        max_abs_diff_index=worst_i,
    )


def _leaves(data: Any, path: str = "") -> dict[str, Any]:
    if isinstance(data, Mapping):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_leaves(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(data, (list, tuple)):
        out = {}
        for i, v in enumerate(data):
            out.update(_leaves(v, f"{path}[{i}]"))
        return out if data else {path: []}
    return {path: data}


def compare_data(name: str, expected: Any, actual: Any, tolerance: Tolerance = EXACT) -> DataComparison:
    """Leaf-by-leaf comparison of JSON-like data: numbers within ``tolerance``, the rest equal."""
    exp, act = _leaves(expected), _leaves(actual)
    diffs: list[DataDifference] = []
    for path in sorted(exp.keys() | act.keys()):
        if path not in act:
            diffs.append(DataDifference(path, exp[path], None, "missing from this run"))
        elif path not in exp:
            diffs.append(DataDifference(path, None, act[path], "new in this run"))
        else:
            e, a = exp[path], act[path]
            numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (e, a))
            if numeric:
                if not tolerance.allows(float(a), float(e)):
                    diffs.append(DataDifference(path, e, a, f"|diff|={abs(a - e):.6g} > {tolerance.allowed(e):.6g}"))
            elif e != a:
                diffs.append(DataDifference(path, e, a, "changed"))
    return DataComparison(name, len(exp.keys() | act.keys()), tuple(diffs), tolerance)


def compare_curves(
    name: str,
    expected: Mapping[str, Sequence[float]],
    actual: Mapping[str, Sequence[float]],
    allowance: Mapping[str, Sequence[float]],
    max_outliers: int,
    origin: str,
) -> DataComparison:
    """Per-step curves: each step within its allowance, up to ``max_outliers`` steps per curve excepted.

    A curve with more outliers contributes all of them as differences; a missing or new curve,
    or one of another length, is a difference of its own.
    """
    diffs: list[DataDifference] = []
    total = 0
    for key in sorted(expected.keys() | actual.keys()):
        if key not in actual or key not in expected:
            diffs.append(
                DataDifference(key, expected.get(key) and "curve", actual.get(key) and "curve", "curve missing or new")
            )
            continue
        e, a, tol = expected[key], actual[key], allowance.get(key, [0.0] * len(expected[key]))
        total += len(e)
        if len(e) != len(a):
            diffs.append(DataDifference(key, f"{len(e)} steps", f"{len(a)} steps", "curve length changed"))
            continue
        out = [
            DataDifference(f"{key}[{t}]", ev, av, f"|diff|={abs(av - ev):.4g} > allowance {al:.4g}")
            for t, (ev, av, al) in enumerate(zip(e, a, tol, strict=True))
            if not (abs(av - ev) <= al)
        ]
        if len(out) > max_outliers:
            diffs += out
    return DataComparison(
        name, total, tuple(diffs), Tolerance(0.0, 0.0, f"{origin}; up to {max_outliers} outlier steps per curve")
    )


# -- messages ---------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.9g}"
    return repr(v)


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "n/a"


def explain(result: AnyComparison) -> str:
    """The single place that turns a comparison result into a human-readable message."""
    verdict = "ok" if result.passed else "FAILED"
    if isinstance(result, ScalarComparison):
        unit = f" {result.unit}" if result.unit else ""
        return (
            f"{result.name}: {verdict}: got {_fmt(result.actual)}{unit}, expected {_fmt(result.expected)}{unit}; "
            f"|difference| {result.abs_diff:.6g} (up to {result.allowed:.6g} allowed: {result.tolerance.describe()})"
        )
    if isinstance(result, BoundComparison):
        unit = f" {result.unit}" if result.unit else ""
        rel = "<=" if result.passed else ">"
        return f"{result.name}: {verdict}: {_fmt(result.value)}{unit} {rel} bound {_fmt(result.bound)}{unit} ({result.origin})"
    if isinstance(result, ElementwiseComparison):
        lines = [
            f"{result.name}: {verdict}: mismatched elements: {result.count} / {result.total} "
            f"({_pct(result.count, result.total)}); criterion: {result.criterion}"
        ]
        if result.max_abs_diff is not None and result.max_abs_diff_index is not None:
            what = "error/budget" if result.criterion.startswith("|autocast") else "absolute difference"
            lines.append(f"  greatest {what}: {result.max_abs_diff:.6g} at index {result.max_abs_diff_index}")
        for m in result.mismatches[:SHOWN_MISMATCHES]:
            where = f"  [{m.index}]" + (f" input {_fmt(m.input)}" if m.input is not None else "")
            if m.expected is None:
                lines.append(f"{where}: got {_fmt(m.actual)} ({m.detail})")
            elif m.detail.startswith("budget"):
                lines.append(
                    f"{where}: reference {_fmt(m.expected)}, got {_fmt(m.actual)} (error {abs(m.actual - m.expected):.3g} > {m.detail})"
                )
            elif " bits" in m.detail:
                lines.append(f"{where}: expected {m.expected:#x}, got {m.actual:#x} ({m.detail})")
            else:
                lines.append(f"{where}: expected {_fmt(m.expected)}, got {_fmt(m.actual)}")
        if result.count > SHOWN_MISMATCHES:
            lines.append(f"  ... and {result.count - SHOWN_MISMATCHES} more")
        return "\n".join(lines)
    lines = [
        f"{result.name}: {verdict}: {len(result.differences)} of {result.total_leaves} values differ "
        f"(allowance: {result.tolerance.describe()})"
    ]
    for d in result.differences[: SHOWN_MISMATCHES * 4]:
        lines.append(f"  {d.path}: expected {_fmt(d.expected)}, got {_fmt(d.actual)} ({d.reason})")
    if len(result.differences) > SHOWN_MISMATCHES * 4:
        lines.append(f"  ... and {len(result.differences) - SHOWN_MISMATCHES * 4} more")
    return "\n".join(lines)
