"""Comparisons as pure functions returning typed results, and the one place that explains them.

Modelled on ``torch.testing._comparison``: a comparison never raises or prints; it returns a
frozen result of one class per kind of input (a scalar, a value against a bound, many elements,
nested data, a claim decided by its own rule) whose ``passed`` says the verdict and whose
``outcome`` is the :class:`~harness.numerics.verdict.Outcome`. Each kind owns its explanation
(``explain()``, the message a failing test shows) and its report row (``measurement()``); both
read typed fields only (a mismatch's :class:`MismatchKind`, an elementwise result's
:class:`Measure`), never message text. A new kind is one class: nothing else switches on kinds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from harness.numerics.formats import FloatFormat
from harness.numerics.tolerance import EXACT, Tolerance
from harness.numerics.verdict import Outcome, RowKind

if TYPE_CHECKING:
    import torch

#: How many individual mismatches a message lists before summarising.
SHOWN_MISMATCHES = 5


class Comparison(Protocol):
    name: str

    @property
    def passed(self) -> bool: ...


@dataclass(frozen=True)
class Measurement:
    """What a comparison puts in its report row: the metric, the value it was decided on, what
    was expected and allowed, and where the allowance comes from (``note``)."""

    metric: str
    value: float | None
    expected: float | None = None
    allowance: float | None = None
    unit: str = ""
    note: str = ""
    tags: Mapping[str, Any] = field(default_factory=dict)
    #: what the row is (RowKind.MEASUREMENT unless the comparison says otherwise)
    kind: RowKind = RowKind.MEASUREMENT


class _Judged:
    """What every comparison kind owns: its outcome (from ``passed``), its explanation and its
    row. A new kind implements the three; nothing else switches on the kind."""

    @property
    def passed(self) -> bool:
        raise NotImplementedError

    @property
    def outcome(self) -> Outcome:
        return Outcome.of(self.passed)

    def explain(self) -> str:
        """The message a failing test shows."""
        raise NotImplementedError

    def measurement(self) -> Measurement:
        """The report row's measurement."""
        raise NotImplementedError


class MismatchKind(Enum):
    """What a mismatch compares, which decides how it is shown."""

    #: a value against an expected value (within a tolerance)
    VALUE = "value"
    #: a bit pattern against the reference's bit pattern
    BITS = "bits"
    #: an error against its per-element budget
    BUDGET = "budget"
    #: an output that violates a predicate (no expected value)
    PREDICATE = "predicate"


class Measure(Enum):
    """What an elementwise result's ``max_abs_diff`` holds."""

    ABS_DIFF = "absolute difference"
    ERROR_OVER_BUDGET = "error/budget"


@dataclass(frozen=True)
class ScalarComparison(_Judged):
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

    def explain(self) -> str:
        return explain_scalar(self)

    def measurement(self) -> Measurement:
        return Measurement(self.name, self.actual, self.expected, self.allowed, self.unit, self.tolerance.origin)


@dataclass(frozen=True)
class BoundComparison(_Judged):
    """A measured value against an upper bound (an error budget)."""

    name: str
    value: float
    bound: float
    origin: str
    unit: str = ""

    @property
    def passed(self) -> bool:
        return not math.isnan(self.value) and self.value <= self.bound

    def explain(self) -> str:
        return explain_bound(self)

    def measurement(self) -> Measurement:
        return Measurement(self.name, self.value, None, self.bound, self.unit, self.origin)


@dataclass(frozen=True)
class Mismatch:
    index: int
    expected: Any
    actual: Any
    input: Any = None
    detail: str = ""
    kind: MismatchKind = MismatchKind.VALUE
    #: the element's budget (``MismatchKind.BUDGET``)
    budget: float | None = None


@dataclass(frozen=True)
class ElementwiseComparison(_Judged):
    """Many values compared one by one (elements of a tensor, examples of a property)."""

    name: str
    total: int
    mismatches: tuple[Mismatch, ...]
    criterion: str
    mismatch_count: int = -1
    #: the greatest difference (or error/budget ratio, see ``measure``) over all elements
    max_abs_diff: float | None = None
    max_abs_diff_index: int | None = None
    measure: Measure = Measure.ABS_DIFF

    @property
    def count(self) -> int:
        return len(self.mismatches) if self.mismatch_count < 0 else self.mismatch_count

    @property
    def passed(self) -> bool:
        return self.count == 0

    def explain(self) -> str:
        return explain_elementwise(self)

    def measurement(self) -> Measurement:
        return Measurement(
            f"{self.name}.mismatched", self.count, 0, 0, "elements", self.criterion, {"total": self.total}
        )


@dataclass(frozen=True)
class DataDifference:
    path: str
    expected: Any
    actual: Any
    reason: str


@dataclass(frozen=True)
class DataComparison(_Judged):
    """Nested data (a baseline) compared leaf by leaf."""

    name: str
    total_leaves: int
    differences: tuple[DataDifference, ...]
    tolerance: Tolerance = field(default=EXACT)

    @property
    def passed(self) -> bool:
        return not self.differences

    def explain(self) -> str:
        return explain_data(self)

    def measurement(self) -> Measurement:
        return Measurement(f"{self.name}.differences", len(self.differences), 0, 0, "values", self.tolerance.origin)


@dataclass(frozen=True)
class ClaimComparison(_Judged):
    """A claim decided by its own rule (a ratio against a margin, an equality of counts, a set of
    expected failures): the measured ``value``, whether the claim ``holds``, what had to hold
    (``criterion``) and what was seen (``detail``, one line per finding)."""

    name: str
    value: float
    holds: bool
    criterion: str
    detail: tuple[str, ...] = ()
    expected: float | None = None
    allowance: float | None = None
    unit: str = ""
    #: the outcome when the claim holds: PASS, or KNOWN for a recorded finding of the stack
    #: (a known deviation whose check notices when it changes)
    holds_as: Outcome = Outcome.PASS
    #: the outcome when it does not: FAIL, or INCONCLUSIVE where what did not hold is the
    #: precondition of a verdict (the check tested nothing), not the claim
    fails_as: Outcome = Outcome.FAIL
    #: what its report row is (a speedup, a known issue, ...)
    kind: RowKind = RowKind.MEASUREMENT

    @property
    def passed(self) -> bool:
        return self.holds

    @property
    def outcome(self) -> Outcome:
        return self.holds_as if self.holds else self.fails_as

    def explain(self) -> str:
        return explain_claim(self)

    def measurement(self) -> Measurement:
        return Measurement(
            self.name, self.value, self.expected, self.allowance, self.unit, self.criterion, kind=self.kind
        )


AnyComparison = ScalarComparison | BoundComparison | ElementwiseComparison | DataComparison | ClaimComparison


# -- comparisons ------------------------------------------------------------------------------
def compare_scalar(name: str, actual: float, expected: float, tolerance: Tolerance, unit: str = "") -> ScalarComparison:
    return ScalarComparison(name, float(actual), float(expected), tolerance, unit)


def compare_bound(name: str, value: float, bound: float, origin: str, unit: str = "") -> BoundComparison:
    return BoundComparison(name, float(value), float(bound), origin, unit)


def compare_claim(
    name: str,
    value: float | bool,
    holds: bool,
    criterion: str,
    *,
    detail: Sequence[str] | str = (),
    expected: float | None = None,
    allowance: float | None = None,
    unit: str = "",
    finding: bool = False,
    inconclusive: bool = False,
    kind: RowKind = RowKind.MEASUREMENT,
) -> ClaimComparison:
    """A claim whose rule the caller decides; ``detail`` says what was seen when it does not hold.
    ``finding=True``: the claim is that a known deviation is still there (recorded as KNOWN).
    ``inconclusive=True``: the claim is a precondition of a verdict; not holding is INCONCLUSIVE."""
    lines = (detail,) if isinstance(detail, str) else tuple(detail)
    holds_as = Outcome.KNOWN if finding else Outcome.PASS
    fails_as = Outcome.INCONCLUSIVE if inconclusive else Outcome.FAIL
    return ClaimComparison(
        name, float(value), bool(holds), criterion, lines, expected, allowance, unit, holds_as, fails_as, kind
    )


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
        bad.append(Mismatch(i, e, a, None if inputs is None else inputs[i], detail, MismatchKind.BITS))
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
                bad.append(Mismatch(i, None, o, x, "violates the criterion", MismatchKind.PREDICATE))
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


#: What :func:`compare_within` compares by default: an autocast result against float64.
AUTOCAST_VS_FP64 = "|autocast - float64 reference|"


def compare_within(
    name: str,
    actual: torch.Tensor,
    reference: torch.Tensor,
    bound: torch.Tensor,
    origin: str,
    what: str = AUTOCAST_VS_FP64,
) -> ElementwiseComparison:
    """Elementwise ``|actual - reference| <= bound`` (an error budget per element), in float64.

    ``what`` names the two sides in the criterion (``"|DDP - one process|"``); ``max_abs_diff``
    holds the worst ratio error/budget (1.0 is the edge of the budget).
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
        Mismatch(i, float(r[i]), float(a[i]), None, "", MismatchKind.BUDGET, float(b[i]))
        for i in bad_idx[:SHOWN_MISMATCHES]
    )
    return ElementwiseComparison(
        name,
        int(a.numel()),
        shown,
        f"{what} <= budget: {origin}",
        mismatch_count=len(bad_idx),
        max_abs_diff=None if worst_i is None else float(ratio[worst_i]),
        max_abs_diff_index=worst_i,
        measure=Measure.ERROR_OVER_BUDGET,
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


def compare_members(name: str, expected: Sequence[Any], actual: Sequence[Any]) -> DataComparison:
    """Two collections of names compared as sets: what left and what came (an op list where one op
    removed shifts every later index would otherwise read as dozens of changed positions)."""
    exp, act = {str(x) for x in expected}, {str(x) for x in actual}
    diffs = [DataDifference(x, x, None, "missing from this run") for x in sorted(exp - act)]
    diffs += [DataDifference(x, None, x, "new in this run") for x in sorted(act - exp)]
    return DataComparison(name, len(exp | act), tuple(diffs), EXACT)


def compare_curves(
    name: str,
    expected: Mapping[str, Sequence[float]],
    actual: Mapping[str, Sequence[float]],
    allowance: Mapping[str, Sequence[float]],
    max_outliers: int,
    origin: str,
    max_run: int | None = None,
) -> DataComparison:
    """Per-step curves: each step within its allowance, up to ``max_outliers`` steps per curve
    excepted, of which at most ``max_run`` in a row (None: any).

    A curve with more outliers (or a longer run of them) contributes all of them as differences;
    a missing or new curve, or one of another length, is a difference of its own.
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
        outside = [t for t, (ev, av, al) in enumerate(zip(e, a, tol, strict=True)) if not (abs(av - ev) <= al)]
        longest, run = 0, 0
        for i, t in enumerate(outside):
            run = run + 1 if i and t == outside[i - 1] + 1 else 1
            longest = max(longest, run)
        if len(out) > max_outliers or (max_run is not None and longest > max_run):
            diffs += out
    runs = f", at most {max_run} in a row" if max_run is not None else ""
    return DataComparison(
        name, total, tuple(diffs), Tolerance(0.0, 0.0, f"{origin}; up to {max_outliers} outlier steps per curve{runs}")
    )


# -- messages ---------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.9g}"
    return repr(v)


def _pct(n: int, total: int) -> str:
    return f"{100.0 * n / total:.1f}%" if total else "n/a"


def _verdict(passed: bool) -> str:
    return "ok" if passed else "FAILED"


def _unit(unit: str) -> str:
    return f" {unit}" if unit else ""


def explain_scalar(r: ScalarComparison) -> str:
    u = _unit(r.unit)
    return (
        f"{r.name}: {_verdict(r.passed)}: got {_fmt(r.actual)}{u}, expected {_fmt(r.expected)}{u}; "
        f"|difference| {r.abs_diff:.6g} (up to {r.allowed:.6g} allowed: {r.tolerance.describe()})"
    )


def explain_bound(r: BoundComparison) -> str:
    u, rel = _unit(r.unit), "<=" if r.passed else ">"
    return f"{r.name}: {_verdict(r.passed)}: {_fmt(r.value)}{u} {rel} bound {_fmt(r.bound)}{u} ({r.origin})"


def explain_mismatch(m: Mismatch) -> str:
    where = f"  [{m.index}]" + (f" input {_fmt(m.input)}" if m.input is not None else "")
    if m.kind is MismatchKind.PREDICATE:
        return f"{where}: got {_fmt(m.actual)} ({m.detail})"
    if m.kind is MismatchKind.BUDGET:
        return (
            f"{where}: reference {_fmt(m.expected)}, got {_fmt(m.actual)} "
            f"(error {abs(m.actual - m.expected):.3g} > budget {m.budget:.3g})"
        )
    if m.kind is MismatchKind.BITS:
        return f"{where}: expected {m.expected:#x}, got {m.actual:#x} ({m.detail})"
    return f"{where}: expected {_fmt(m.expected)}, got {_fmt(m.actual)}"


def explain_elementwise(r: ElementwiseComparison) -> str:
    lines = [
        f"{r.name}: {_verdict(r.passed)}: mismatched elements: {r.count} / {r.total} "
        f"({_pct(r.count, r.total)}); criterion: {r.criterion}"
    ]
    if r.max_abs_diff is not None and r.max_abs_diff_index is not None:
        lines.append(f"  greatest {r.measure.value}: {r.max_abs_diff:.6g} at index {r.max_abs_diff_index}")
    lines += [explain_mismatch(m) for m in r.mismatches[:SHOWN_MISMATCHES]]
    if r.count > SHOWN_MISMATCHES:
        lines.append(f"  ... and {r.count - SHOWN_MISMATCHES} more")
    return "\n".join(lines)


def explain_data(r: DataComparison) -> str:
    lines = [
        f"{r.name}: {_verdict(r.passed)}: {len(r.differences)} of {r.total_leaves} values differ "
        f"(allowance: {r.tolerance.describe()})"
    ]
    for d in r.differences[: SHOWN_MISMATCHES * 4]:
        lines.append(f"  {d.path}: expected {_fmt(d.expected)}, got {_fmt(d.actual)} ({d.reason})")
    if len(r.differences) > SHOWN_MISMATCHES * 4:
        lines.append(f"  ... and {len(r.differences) - SHOWN_MISMATCHES * 4} more")
    return "\n".join(lines)


def explain_claim(r: ClaimComparison) -> str:
    u = _unit(r.unit)
    seen = f"{_fmt(r.value)}{u}"
    if r.allowance is not None:
        seen += f" (allowance {_fmt(r.allowance)}{u})"
    verdict = Outcome.INCONCLUSIVE.label if r.outcome is Outcome.INCONCLUSIVE else _verdict(r.passed)
    head = f"{r.name}: {verdict}: {seen}; criterion: {r.criterion}"
    return "\n".join([head, *(f"  {line}" for line in r.detail)])


def explain(result: AnyComparison) -> str:
    """The message a failing test shows: each comparison kind explains itself."""
    return result.explain()
