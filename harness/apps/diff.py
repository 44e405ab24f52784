"""``amp-harness diff A B``: what changed between two runs (two stacks, two machines, two commits).

Each side is a run report or a report directory; a directory gives its latest run. Every check,
metric, autocast policy cell and known issue the two runs share a suite for gets one status, in the
vocabulary of PyTorch's Dynamo accuracy CSVs:

* ``regressed``: a check whose outcome fails its test in B (FAIL, INCONCLUSIVE) and did not in A
  (the only status that makes the exit status 1);
* ``improved``: the other way round;
* ``new`` / ``missing``: in B only / in A only;
* ``changed``: a check with another outcome, a recorded training step whose aten ops part (the
  first op whose output bits, dtype, shape or module changed is named), a comparable metric beyond its stated run-to-run
  drift, a judged (or noisy) speedup beyond the speed rule's detectable slowdown, an autocast
  policy cell with another result, a known issue that appeared, disappeared or changed status;
* ``unchanged``: the rest (counted per suite, listed in csv output).

A check's outcome is the worst (:meth:`harness.numerics.verdict.Outcome.worst`) of its rows and
its test's own verdict, so a failed test never reads as passing. Speedups the speed rule judged
against nothing (an uncalibrated class, a case calibration never judges) are not compared; their
count is in the summary. Suites only one side ran are named and skipped: their checks would all
read as new or missing.
"""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from harness.domains.op_prints import OpPrint, first_difference
from harness.numerics.trend import finite_or_none, violates
from harness.numerics.verdict import Outcome, RowKind
from harness.storage import fleet
from harness.storage import report as rp

#: the speed rule's detectable slowdown (harness.domains.engines.bench.bench.DETECT_SLOWDOWN): an unjudged
#: speedup that moved less than this between two runs is within what the rule cannot tell apart
SPEED_CHANGE = 1.3
#: speedups diff compares: those the speed rule judged (pass, fail) or measured twice without a
#: verdict (noisy); an unjudged one (a class never calibrated, or a case calibration records and
#: never judges, such as layer_norm kept in fp32 by autocast) is left out, and counted
SPEED_COMPARED = frozenset({Outcome.PASS, Outcome.FAIL, Outcome.NOISY})
#: the widest table the text format prints
WIDTH = 100


class Status(Enum):
    REGRESSED = "regressed"
    IMPROVED = "improved"
    NEW = "new"
    MISSING = "missing"
    CHANGED = "changed"
    UNCHANGED = "unchanged"


#: the order statuses are listed in (worst first)
ORDER = {s: i for i, s in enumerate(Status)}


@dataclass(frozen=True)
class Change:
    """One entry of a diff: a check, metric, policy cell or known issue, and what happened to it."""

    suite: str
    kind: str
    name: str
    status: Status
    a: str
    b: str
    detail: str = ""


@dataclass(frozen=True)
class Side:
    """One side of a diff: the run, and the words its header line uses."""

    label: str
    report: rp.LoadedReport

    @property
    def run_id(self) -> str:
        return str(self.report.meta.get("run_id", self.report.path.name))

    def describe(self) -> str:
        meta = self.report.meta
        fp = meta.get("fingerprint") or {}
        cls = rp.hardware_class(meta)
        torch = fp.get("torch_version") if isinstance(fp, Mapping) else None
        commit = str(meta.get("git_commit") or "")[:8]
        return f"{self.label}: run {self.run_id}, torch {torch or '?'}, commit {commit or '?'}\n   class {cls or '?'}"


@dataclass
class Diff:
    a: Side
    b: Side
    changes: list[Change] = field(default_factory=list)
    #: suites one side ran and the other did not: (suite, "A" or "B")
    skipped_suites: list[tuple[str, str]] = field(default_factory=list)
    #: speedups measured but judged against nothing on at least one side: not compared
    speed_not_compared: int = 0
    #: suites of the project's tests of itself (``amp_self_tests``): ranked apart, never the exit status
    self_test_suites: set[str] = field(default_factory=set)

    def count(self, status: Status, self_tests: bool = False) -> int:
        """Entries of ``status`` among the qualification's (``self_tests``: among the project's self-tests)."""
        return sum(1 for c in self.changes if c.status is status and (c.suite in self.self_test_suites) == self_tests)

    @property
    def regressed(self) -> bool:
        """A qualification check regressed (a self-test that did is listed, and is not this)."""
        return self.count(Status.REGRESSED) > 0

    def summary(self) -> str:
        out = ", ".join(f"{self.count(s)} {s.value}" for s in Status)
        if self.speed_not_compared:
            out += f"; {self.speed_not_compared} speedups not compared (judged against nothing on their class)"
        if self.self_test_suites:
            own = ", ".join(f"{self.count(s, True)} {s.value}" for s in Status if self.count(s, True))
            out += f"; project self-tests apart: {own or 'none compared'}"
        return out

    def ordered_suites(self) -> list[str]:
        """The qualification's suites, then the project's self-tests' (each group sorted)."""
        suites = {c.suite for c in self.changes}
        return sorted(suites - self.self_test_suites) + sorted(suites & self.self_test_suites)


class DiffInputError(Exception):
    """A side that cannot be diffed (not a report, corrupt, empty): the message names it."""


def load_side(label: str, path: str | Path) -> Side:
    """A run report directory, its rows.parquet, or a report directory (its latest run)."""
    p = Path(path)
    if not p.exists():
        raise DiffInputError(f"{label}: {p} does not exist")
    try:
        target = rp.newest_run(p)
        loaded = rp.load(target)
    except rp.ReportError as e:
        raise DiffInputError(f"{label}: {e}") from None
    if loaded.rows.empty:
        raise DiffInputError(f"{label}: {target} has no rows (an empty run)")
    return Side(label, loaded)


def fleet_side(label: str, root: str | Path, selector: str) -> Side:
    """The latest run of a fleet dataset that matches ``selector`` (:func:`harness.storage.fleet.select`)."""

    try:
        run = fleet.select(fleet.index(root), selector)
        loaded = fleet.load(run)
    except (FileNotFoundError, ValueError, rp.ReportError) as e:
        raise DiffInputError(f"{label}: {e}") from None
    if loaded.rows.empty:
        raise DiffInputError(f"{label}: {run.where} has no rows (an empty run)")
    return Side(label, loaded)


# -- building the diff ---------------------------------------------------------------------------------
def _records(side: Side) -> list[dict[str, Any]]:
    return rp.records(side.report.rows)


def _short_check(nodeid: str) -> str:
    """``test_x[cpu-bf16]`` of ``suites/autocast/test_y.py::test_x[cpu-bf16]``."""
    return nodeid.rsplit("::", 1)[-1]


def _checks(records: Iterable[dict[str, Any]], tests: Iterable[dict[str, Any]] = ()) -> dict[tuple[str, str], Outcome]:
    """(suite, short test id) -> the check's outcome (:func:`harness.storage.report.test_outcomes`:
    the test's own verdict with its rows; a failed test never reads as passing)."""
    return {(suite, _short_check(node)): o for node, (suite, o) in rp.test_outcomes(records, tests).items()}


def _kind(r: Mapping[str, Any]) -> RowKind:
    """The row's kind column (reports before it get theirs from the metric's name on loading)."""
    return RowKind(str(r.get("kind") or RowKind.MEASUREMENT.value))


def _metric_key(r: Mapping[str, Any]) -> tuple[str, str]:
    parts = [str(r.get(k) or "") for k in ("metric", "dtype", "device")]
    return str(r["suite"]), " ".join(p for p in parts if p)


def _metrics(records: Iterable[dict[str, Any]], *, speed: bool) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(suite, metric) -> (median value, drift) of comparable metrics (``speed``: the speedups)."""
    values: dict[tuple[str, str], list[float]] = {}
    drifts: dict[tuple[str, str], float | None] = {}
    for r in records:
        is_speed = _kind(r) is RowKind.SPEEDUP
        if is_speed != speed or (not speed and not bool(r.get("comparable"))):
            continue
        if speed and Outcome.parse(str(r["outcome"])) not in SPEED_COMPARED:
            continue  # a speedup judged against nothing on its class: the rule says nothing of its moves
        v = finite_or_none(r.get("value"))
        if v is None:
            continue
        key = _metric_key(r)
        values.setdefault(key, []).append(v)
        d = finite_or_none(r.get("drift"))
        drifts[key] = max(d, drifts.get(key) or 0.0) if d is not None else drifts.get(key)
    out = {}
    for key, vs in values.items():
        vs.sort()
        out[key] = (vs[len(vs) // 2], drifts.get(key))
    return out


def _policy(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(suite, "op dtype device") -> the cell's category (what autocast ran the op in)."""
    out = {}
    for r in records:
        metric = str(r["metric"])
        if _kind(r) is RowKind.POLICY:
            tags = rp.row_tags(r)
            cell = f"{metric.removeprefix('policy.')} {r.get('dtype') or ''} {r.get('device') or ''}".strip()
            out[(str(r["suite"]), cell)] = str(tags.get("category", tags.get("result", "?")))
    return out


def _known(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], Outcome]:
    """(suite, issue id) -> its outcome (known: present where listed; pass: absent where not)."""
    out = {}
    for r in records:
        metric = str(r["metric"])
        if _kind(r) is RowKind.KNOWN_ISSUE:
            out[(str(r["suite"]), metric.removeprefix("known_issue."))] = Outcome.parse(str(r["outcome"]))
    return out


def _fingerprints(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[OpPrint]]:
    """(suite, metric) -> the ops of one recorded training step (RowKind.FINGERPRINT rows)."""
    out = {}
    for r in records:
        if _kind(r) is RowKind.FINGERPRINT:
            ops = rp.row_tags(r).get("ops") or []
            out[_metric_key(r)] = [
                OpPrint(i, str(op), str(module), str(dtype), tuple(shape), str(digest), None)
                for i, (op, module, dtype, shape, digest) in enumerate(ops)
            ]
    return out


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _beyond(a: float, b: float, drift: float | None) -> bool:
    """B left A's band: the dashboard's rule (:func:`harness.numerics.trend.violates`); without a stated drift a
    metric is not comparable between two runs."""
    return drift is not None and violates(b, a, drift, [a]) != 0


def diff(a: Side, b: Side) -> Diff:
    ra, rb = _records(a), _records(b)
    suites_a, suites_b = {str(r["suite"]) for r in ra}, {str(r["suite"]) for r in rb}
    shared = suites_a & suites_b
    out = Diff(
        a,
        b,
        skipped_suites=[(s, "A") for s in sorted(suites_a - shared)] + [(s, "B") for s in sorted(suites_b - shared)],
    )
    ra = [r for r in ra if str(r["suite"]) in shared]
    rb = [r for r in rb if str(r["suite"]) in shared]

    ta = [t for t in rp.records(a.report.tests) if str(t["suite"]) in shared]
    tb = [t for t in rp.records(b.report.tests) if str(t["suite"]) in shared]
    ca, cb = _checks(ra, ta), _checks(rb, tb)
    for key in sorted(ca.keys() | cb.keys()):
        oa, ob = ca.get(key), cb.get(key)
        if oa is None:
            status = Status.NEW
        elif ob is None:
            status = Status.MISSING
        elif (ob.fails_test and not oa.fails_test) or (ob.broke and not oa.broke):
            # a test that crashed or hung in B regressed, even from a failure: B lost it
            status = Status.REGRESSED
        elif oa.fails_test and not ob.fails_test:
            status = Status.IMPROVED
        else:
            status = Status.UNCHANGED if oa is ob else Status.CHANGED
        out.changes.append(Change(key[0], "check", key[1], status, oa.label if oa else "-", ob.label if ob else "-"))

    unjudged = {
        _metric_key(r)
        for r in (*ra, *rb)
        if _kind(r) is RowKind.SPEEDUP and Outcome.parse(str(r["outcome"])) not in SPEED_COMPARED
    }
    out.speed_not_compared = len(unjudged)
    for speed in (False, True):
        ma, mb = _metrics(ra, speed=speed), _metrics(rb, speed=speed)
        for key in sorted(ma.keys() | mb.keys()):
            va, vb = ma.get(key), mb.get(key)
            kind = "speed" if speed else "metric"
            if va is None or vb is None:
                status = Status.NEW if va is None else Status.MISSING
                out.changes.append(
                    Change(
                        key[0],
                        kind,
                        key[1],
                        status,
                        "-" if va is None else _fmt(va[0]),
                        "-" if vb is None else _fmt(vb[0]),
                    )
                )
                continue
            (xv, xd), (yv, yd) = va, vb
            if speed:
                moved = xv > 0 and yv > 0 and max(xv / yv, yv / xv) > SPEED_CHANGE
                detail = f"beyond the speed rule's detectable {SPEED_CHANGE}x" if moved else ""
            else:
                drift = yd if yd is not None else xd
                moved = _beyond(xv, yv, drift)
                detail = f"drift {drift:g}" if moved and drift is not None else ""
            status = Status.CHANGED if moved else Status.UNCHANGED
            out.changes.append(Change(key[0], kind, key[1], status, _fmt(xv), _fmt(yv), detail))

    pa, pb = _policy(ra), _policy(rb)
    for key in sorted(pa.keys() | pb.keys()):
        x, y = pa.get(key), pb.get(key)
        if x is None or y is None:
            status = Status.NEW if x is None else Status.MISSING
        else:
            status = Status.UNCHANGED if x == y else Status.CHANGED
        detail = f"{key[1]}: A gives {x}, B gives {y}" if status is Status.CHANGED else ""
        out.changes.append(Change(key[0], "policy", key[1], status, x or "-", y or "-", detail))

    fa, fb = _fingerprints(ra), _fingerprints(rb)
    for key in sorted(fa.keys() | fb.keys()):
        x_ops, y_ops = fa.get(key), fb.get(key)
        if x_ops is None or y_ops is None:
            status = Status.NEW if x_ops is None else Status.MISSING
            out.changes.append(Change(key[0], "ops", key[1], status, "-" if x_ops is None else f"{len(x_ops)} ops",
                                      "-" if y_ops is None else f"{len(y_ops)} ops"))  # fmt: skip
            continue
        parted = first_difference(x_ops, y_ops)
        if parted is None:
            out.changes.append(
                Change(key[0], "ops", key[1], Status.UNCHANGED, f"{len(x_ops)} ops", f"{len(y_ops)} ops")
            )
            continue
        op_a, op_b = parted
        where = op_a or op_b
        assert where is not None
        out.changes.append(
            Change(
                key[0],
                "ops",
                key[1],
                Status.CHANGED,
                op_a.describe() if op_a else "-",
                op_b.describe() if op_b else "-",
                f"first op whose output changed: op #{where.index} aten.{where.op} in {where.module}",
            )
        )

    ka, kb = _known(ra), _known(rb)
    for key in sorted(ka.keys() | kb.keys()):
        x, y = ka.get(key), kb.get(key)
        if x == y:
            status = Status.UNCHANGED
        elif y is Outcome.FAIL:
            status = Status.REGRESSED
        else:
            status = Status.CHANGED
        was, now = (o.known_issue_state if o is not None else "not observed" for o in (x, y))
        detail = f"A: {was}, B: {now}" if status is not Status.UNCHANGED else ""
        out.changes.append(
            Change(key[0], "known", key[1], status, x.value if x else "-", y.value if y else "-", detail)
        )
    out.changes.sort(key=lambda c: (c.suite, ORDER[c.status], c.kind, c.name))
    own = {str(r["suite"]) for r in (*ra, *rb, *ta, *tb) if str(r.get("origin") or rp.QUALIFICATION) == rp.SELF_TEST}
    out.self_test_suites = own
    return out


# -- rendering -------------------------------------------------------------------------------------------
COLUMNS = ("suite", "kind", "name", "status", "a", "b", "detail", "origin")
#: what heads the project's self-tests in a rendered diff
SELF_TEST_HEADING = "project self-tests (the harness's tests of itself, not the stack; never the exit status):"


def _sections(d: Diff) -> list[tuple[str, bool]]:
    """Each suite to render, in order, and whether the self-tests' heading goes before it."""
    suites = d.ordered_suites()
    first = next((s for s in suites if s in d.self_test_suites), None)
    return [(s, s == first) for s in suites]


def _listed(d: Diff) -> list[Change]:
    return [c for c in d.changes if c.status is not Status.UNCHANGED]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"


def render_text(d: Diff) -> str:
    """The grouped table, at most WIDTH columns wide."""
    lines = [_cut(line, WIDTH) for side in (d.a, d.b) for line in side.describe().splitlines()]
    lines.append(_cut(f"summary: {d.summary()}", WIDTH))
    for suite, side in d.skipped_suites:
        lines.append(_cut(f"skipped: suite {suite!r} is only in {side}", WIDTH))
    listed = _listed(d)
    for suite, heading in _sections(d):
        if heading:
            lines += ["", _cut(SELF_TEST_HEADING, WIDTH)]
        rows = [c for c in listed if c.suite == suite]
        unchanged = sum(1 for c in d.changes if c.suite == suite and c.status is Status.UNCHANGED)
        if not rows:
            lines.append(_cut(f"{suite}: {unchanged} unchanged", WIDTH))
            continue
        lines.append("")
        lines.append(_cut(f"{suite}: {len(rows)} listed, {unchanged} unchanged", WIDTH))
        lines.append(f"  {'status':<10} {'kind':<7} {'name':<47} {'A':>15} {'B':>15}")
        for c in rows:
            lines.append(
                f"  {c.status.value:<10} {c.kind:<7} {_cut(c.name, 47):<47} {_cut(c.a, 15):>15} {_cut(c.b, 15):>15}"
            )
            if c.detail:
                lines.append(_cut(f"    {c.detail}", WIDTH))
    return "\n".join(lines) + "\n"


def render_markdown(d: Diff) -> str:
    out = [f"- {' '.join(side.describe().split())}" for side in (d.a, d.b)] + [f"- summary: {d.summary()}"]
    out += [f"- skipped: suite `{s}` is only in {side}" for s, side in d.skipped_suites]
    for suite, heading in _sections(d):
        if heading:
            out += ["", f"# {SELF_TEST_HEADING}"]
        rows = [c for c in _listed(d) if c.suite == suite]
        unchanged = sum(1 for c in d.changes if c.suite == suite and c.status is Status.UNCHANGED)
        out += ["", f"## {suite}: {len(rows)} listed, {unchanged} unchanged"]
        if rows:
            out += ["", "| status | kind | name | A | B | detail |", "|---|---|---|---|---|---|"]
            out += [
                f"| {c.status.value} | {c.kind} | `{c.name}` | {c.a} | {c.b} | {c.detail.replace('|', '/')} |"
                for c in rows
            ]
    return "\n".join(out) + "\n"


def render_csv(d: Diff) -> str:
    """Every entry, unchanged ones included (for a spreadsheet or a dashboard)."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    for c in d.changes:
        origin = rp.SELF_TEST if c.suite in d.self_test_suites else rp.QUALIFICATION
        w.writerow([c.suite, c.kind, c.name, c.status.value, c.a, c.b, c.detail, origin])
    return buf.getvalue()


def render_html(d: Diff) -> str:
    def esc(v: Any) -> str:
        return html.escape(str(v))

    parts = [
        "<!doctype html><meta charset='utf-8'><title>amp-harness diff</title>",
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}"
        ".regressed{color:#b00}.improved{color:#070}</style>",
        f"<p>{esc(' '.join(d.a.describe().split()))}<br>{esc(' '.join(d.b.describe().split()))}<br>"
        f"summary: {esc(d.summary())}</p>",
    ]
    parts += [f"<p>skipped: suite {esc(s)} is only in {side}</p>" for s, side in d.skipped_suites]
    for suite, heading in _sections(d):
        if heading:
            parts.append(f"<h1>{esc(SELF_TEST_HEADING)}</h1>")
        rows = [c for c in _listed(d) if c.suite == suite]
        parts.append(f"<h2>{esc(suite)}: {len(rows)} listed</h2>")
        if rows:
            parts.append("<table><tr><th>status</th><th>kind</th><th>name</th><th>A</th><th>B</th><th>detail</th></tr>")
            parts += [
                f"<tr class='{c.status.value}'><td>{c.status.value}</td><td>{esc(c.kind)}</td><td>{esc(c.name)}</td>"
                f"<td>{esc(c.a)}</td><td>{esc(c.b)}</td><td>{esc(c.detail)}</td></tr>"
                for c in rows
            ]
            parts.append("</table>")
    return "\n".join(parts) + "\n"


RENDERERS = {"text": render_text, "md": render_markdown, "csv": render_csv, "html": render_html}
