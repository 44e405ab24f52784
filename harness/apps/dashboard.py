"""Regression dashboard and run comparison over many run reports.

Loading and flagging are pandas; rendering is one self-contained HTML file (inline CSS, plots as
inline SVG whose points show run, time, commit and value on hover, one inline script that opens
the drill-down a link points at; no network).

Every suite cell (the matrix of the latest run of each class, and the runs x suites grid) is the
worst outcome of its tests (:func:`harness.storage.report.test_outcomes`) and links to its
drill-down: the tests that did not pass, worst first, each with the first line of its failure and
its rows (metric, value, allowance, outcome, note).

Only *comparable* rows are flagged (``Row.comparable``: a deterministic value, or a statistic with
a stated run-to-run ``drift``); information (counts, maxima over random samples, unjudged
timings, intermediate values) is shown, never flagged. A comparable metric's latest value is
compared with the median of the previous ``window`` runs of the same hardware profile: a
deterministic one (drift 0) violates when it changed at all, a statistic when it moved by more
than its drift as a ratio (either way: an unexpected improvement too). "regression" when the last
2 points violate in the same direction (the PyTorch HUD's rule); "suspicious" for an isolated
violation of a deterministic value (a statistic's single excursion is not flagged: measured, clean
speedups leave a 14% band about once in 20 runs here); "insufficient data" when the history is
shorter than ``min_history``. A change between finite and inf/NaN is a violation.
"""

from __future__ import annotations

import html
import io
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

import pandas as pd

from harness.apps import diff as df_
from harness.domains.versions import release
from harness.numerics.trend import band, finite_or_none, violates
from harness.numerics.verdict import Outcome
from harness.storage import atomic, fleet
from harness.storage import report as rp

#: Previous runs whose median is the reference of a point (as CI dashboards of large projects use).
WINDOW = 5
#: Fewer previous runs than this: "insufficient data" rather than a verdict.
MIN_HISTORY = 3
KEY = ["suite", "check", "metric", "dtype", "device"]


@dataclass
class Loaded:
    rows: pd.DataFrame
    runs: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    #: each test's own result (:data:`harness.storage.report.TEST_COLUMNS`, and ``run_id``)
    tests: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=[*rp.TEST_COLUMNS, "origin", "run_id"]))
    #: runs in the fleet dataset the view was drawn from (None: loaded from report directories)
    fleet_runs: int | None = None


def _report_dirs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            out.append(p.parent)
        elif (p / rp.ROWS_PARQUET).exists() or (p / rp.RUN_JSON).exists():
            out.append(p)
        elif p.is_dir():
            out += [d for d in sorted(p.iterdir()) if d.is_dir() and not d.name.startswith(".")]
        else:
            out.append(p)
    return out


def load_reports(paths: Iterable[str | os.PathLike[str]]) -> Loaded:
    """Load run reports; a corrupt or unsupported one is named in ``problems`` and skipped."""
    rows: list[pd.DataFrame] = []
    runs: list[dict[str, Any]] = []
    tests: list[pd.DataFrame] = []
    problems: list[str] = []
    for d in _report_dirs(paths):
        try:
            r = rp.load(d)
        except rp.ReportError as exc:
            problems.append(str(exc))
            continue
        _collect(r, d, rows, runs, tests)
    return _loaded(rows, runs, problems, tests)


def load_fleet(root: str | os.PathLike[str], window: int = WINDOW) -> Loaded:
    """From a fleet dataset (:mod:`harness.storage.fleet`), only what the dashboard shows: the
    last ``window + 1`` runs of each hardware class and stack (trends, flags, stacks view), read
    file by file, so memory is bounded by that, not by the fleet's size."""

    rows: list[pd.DataFrame] = []
    runs: list[dict[str, Any]] = []
    tests: list[pd.DataFrame] = []
    problems: list[str] = []
    everything = fleet.index(root)
    for run in fleet.latest(everything, window + 1):
        try:
            r = fleet.load(run)
        except rp.ReportError as exc:
            problems.append(str(exc))
            continue
        _collect(r, run.path, rows, runs, tests)
    loaded = _loaded(rows, runs, problems, tests)
    loaded.fleet_runs = len(everything)
    return loaded


def _collect(
    r: rp.LoadedReport, d: PurePath, rows: list[pd.DataFrame], runs: list[dict[str, Any]], tests: list[pd.DataFrame]
) -> None:
    df = r.rows.copy()
    for col in rp.COLUMNS:  # older schemas lack some columns: fill them
        if col not in df.columns:
            df[col] = pd.NA
    if "origin" not in df.columns:
        df = rp.with_origin(df, r.meta)
    rows.append(df[list(rp.LOADED_COLUMNS)])
    meta = r.meta
    fp = meta.get("fingerprint", {})
    run_id = meta.get("run_id", d.name)
    results = r.tests.assign(run_id=run_id)
    tests.append(results)
    runs.append(
        {
            "run_id": run_id,
            "started": meta.get("started"),
            "profile": rp.hardware_class(meta),
            "isa_profile": meta.get("profile"),
            "device": meta.get("primary_device"),
            "torch": fp.get("torch_version"),
            "cuda": fp.get("cuda_version"),
            "harness": meta.get("harness_version"),
            "commit": meta.get("git_commit"),
            "schema": meta.get("schema_version"),
            "verdict": run_verdict(df, results, meta).label,
            "rows": len(df),
            "host": fp.get("hostname"),
        }
    )


def run_verdict(rows: pd.DataFrame, tests: pd.DataFrame, meta: dict[str, Any]) -> Outcome:
    """A run's verdict: the worst outcome of its qualification tests (:func:`harness.storage.report.test_outcomes`;
    the project's self-tests are apart, :func:`self_test_health`; reports before schema 4 have only
    counts of test results: a failed or errored test is a FAIL)."""
    counts = meta.get("tests") or {}
    legacy = [Outcome.FAIL] if tests.empty and (counts.get("failed") or counts.get("error")) else []
    per_test = rp.frame_test_outcomes(rp.qualification(rows), rp.qualification(tests))
    worst = Outcome.worst([*(o for _, o in per_test.values()), *legacy])
    return worst if worst is not None else Outcome.SKIP


def _loaded(
    rows: list[pd.DataFrame], runs: list[dict[str, Any]], problems: list[str], tests: list[pd.DataFrame]
) -> Loaded:
    rows_df = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=list(rp.LOADED_COLUMNS))
    runs_df = pd.DataFrame(
        runs,
        columns=[
            "run_id",
            "started",
            "profile",
            "isa_profile",
            "device",
            "torch",
            "cuda",
            "harness",
            "commit",
            "schema",
            "verdict",
            "rows",
            "host",
        ],
    )
    nonempty = [t for t in tests if len(t)]
    tests_df = (
        pd.concat(nonempty, ignore_index=True)
        if nonempty
        else pd.DataFrame(columns=[*rp.TEST_COLUMNS, "origin", "run_id"])
    )
    return Loaded(
        rows_df, runs_df.sort_values("started", na_position="first").reset_index(drop=True), problems, tests_df
    )


def metric_ids(df: pd.DataFrame) -> pd.Series:
    """``suite/check/metric/dtype/device``: what identifies a metric across runs (vectorised)."""
    parts = [df[k].astype("string").fillna("") for k in KEY]
    out = parts[0]
    for p in parts[1:]:
        out = out + "/" + p
    return out


def series(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """One numeric value per (profile, metric id, run), ordered by run start time, with whether
    the metric is comparable and its drift (from its rows), and the run's time and commit."""
    df = rows.dropna(subset=["value"]).copy()
    df["metric_id"] = metric_ids(df)
    if len(runs) and "profile" in runs:  # the run's hardware class, where its report names one
        by_run = runs.dropna(subset=["profile"]).set_index("run_id")["profile"]
        df["profile"] = df["run_id"].map(by_run).fillna(df["profile"])
    order = {r: i for i, r in enumerate(runs["run_id"])}
    df["order"] = df["run_id"].map(order)
    if "comparable" not in df.columns:
        df["comparable"] = False
    df["comparable"] = df["comparable"].astype("boolean").fillna(False).astype(bool)
    if "drift" not in df.columns:
        df["drift"] = float("nan")
    df = df.groupby(["profile", "metric_id", "run_id"], as_index=False, sort=False).agg(
        value=("value", "median"),
        allowance=("allowance", "max"),
        comparable=("comparable", "all"),
        drift=("drift", "max"),
        order=("order", "first"),
        suite=("suite", "first"),
    )
    info = runs.set_index("run_id")
    df["started"] = df["run_id"].map(info["started"]) if "started" in info else None
    df["commit"] = df["run_id"].map(info["commit"]) if "commit" in info else None
    return df.sort_values(["profile", "metric_id", "order"]).reset_index(drop=True)


def flag_history(
    values: Sequence[float],
    drifts: Sequence[float | None] | None = None,
    window: int = WINDOW,
    min_history: int = MIN_HISTORY,
) -> dict[str, Any]:
    """The flag of the latest point of one series (pure; the rules of the module docstring).
    ``drifts``: each point's relative drift (0: deterministic; None: the history's spread)."""
    vals = [float(v) for v in values]
    drift = list(drifts) if drifts is not None else [None] * len(vals)

    def reference(prev: Sequence[float]) -> float:
        finite = [v for v in prev if math.isfinite(v)]
        return statistics.median(finite) if len(finite) * 2 > len(prev) else statistics.median_low(prev)

    def violation(i: int) -> int:
        prev = vals[max(0, i - window) : i]
        if len(prev) < min_history:
            return 0
        return violates(vals[i], reference(prev), drift[i], [v for v in prev if math.isfinite(v)] or [0.0])

    n = len(vals)
    if n - 1 < min_history:
        return {"flag": "insufficient data", "direction": "", "reference": None}
    last, before = violation(n - 1), violation(n - 2) if n >= 2 else 0
    ref = reference(vals[max(0, n - 1 - window) : n - 1])
    direction = "up" if last > 0 else "down" if last < 0 else ""
    if last and before == last:
        return {"flag": "regression", "direction": direction, "reference": ref}
    latest_drift = drift[n - 1]
    statistic = latest_drift is not None and latest_drift > 0  # NaN compares False: no stated drift
    if last and not statistic:
        return {"flag": "suspicious", "direction": direction, "reference": ref}
    # a statistic's single excursion is the noise its drift does not cover: flagged only when repeated
    return {"flag": "ok", "direction": "", "reference": ref}


def flags(ser: pd.DataFrame, window: int = WINDOW, min_history: int = MIN_HISTORY) -> pd.DataFrame:
    """The flag of every comparable metric (information is never flagged)."""
    out = []
    comparable = ser[ser["comparable"]] if "comparable" in ser.columns else ser.iloc[:0]
    for (profile, metric), g in comparable.groupby(["profile", "metric_id"], sort=False):
        drifts = [None if pd.isna(d) else float(d) for d in g["drift"]]
        f = flag_history(g["value"].tolist(), drifts, window, min_history)
        out.append(
            {
                "profile": profile,
                "metric_id": metric,
                "suite": g["suite"].iloc[-1],
                "latest": g["value"].iloc[-1],
                "drift": g["drift"].iloc[-1],
                "points": len(g),
                **f,
            }
        )
    return pd.DataFrame(
        out,
        columns=["profile", "metric_id", "suite", "latest", "drift", "points", "flag", "direction", "reference"],
    )


def _by_run(df: pd.DataFrame | None, run_ids: Iterable[str]) -> dict[str, pd.DataFrame]:
    """Each run's part of a frame (rows or test results), grouped once."""
    empty = pd.DataFrame() if df is None else df.iloc[:0]
    if df is None or df.empty:
        return {r: empty for r in run_ids}
    groups = {str(k): g for k, g in df.groupby("run_id", sort=False)}
    return {r: groups.get(r, empty) for r in run_ids}


def run_outcomes(
    rows: pd.DataFrame, tests: pd.DataFrame | None, run_ids: Iterable[str], origin: str = rp.QUALIFICATION
) -> dict[str, dict[str, tuple[str, Outcome]]]:
    """run id -> node id -> (suite, outcome) of each test of ``origin`` (the qualification's, or
    the project's self-tests: :func:`harness.storage.report.test_outcomes`)."""
    ids = [str(r) for r in run_ids]
    rows, tests = rp.of_origin(rows, origin), None if tests is None else rp.of_origin(tests, origin)
    rows_of, tests_of = _by_run(rows, ids), _by_run(tests, ids)
    return {r: rp.frame_test_outcomes(rows_of[r], tests_of[r]) for r in ids}


def self_test_health(rows: pd.DataFrame, runs: pd.DataFrame, tests: pd.DataFrame | None = None) -> list[str]:
    """One line per hardware class (its latest run): the project's self-tests, counted by outcome
    with the worst named; none where the run has no self-tests."""
    latest = runs.dropna(subset=["profile"]).groupby("profile").tail(1)
    per_run = run_outcomes(rows, tests, latest["run_id"], rp.SELF_TEST)
    lines = []
    for run_id, profile in zip(latest["run_id"], latest["profile"], strict=True):
        outcomes = per_run[str(run_id)]
        if not outcomes:
            continue
        counts: dict[Outcome, int] = {}
        for _, o in outcomes.values():
            counts[o] = counts.get(o, 0) + 1
        worst = Outcome.worst(counts)
        first = next((n for n, (_, o) in outcomes.items() if o is worst), "")
        tally = ", ".join(f"{n} {o.label}" for o, n in sorted(counts.items(), key=lambda kv: -kv[0].severity))
        bad = worst is not None and worst.fails_test
        lines.append(
            f"{profile}: harness self-tests: {len(outcomes)} tests ({tally})"
            + (f"; first {worst.label}: {first}" if bad and worst else "")
        )
    return lines


def _worst_by_suite(outcomes: dict[str, tuple[str, Outcome]]) -> dict[str, Outcome]:
    worst: dict[str, Outcome] = {}
    for suite, outcome in outcomes.values():
        worst[suite] = max((worst.get(suite, outcome), outcome), key=lambda o: o.severity)
    return worst


def pass_fail_matrix(rows: pd.DataFrame, runs: pd.DataFrame, tests: pd.DataFrame | None = None) -> pd.DataFrame:
    """suite x hardware class for the latest run of each class: the worst outcome of the suite's
    tests (:func:`harness.storage.report.test_outcomes`: each test's own verdict with its rows),
    named by :attr:`Outcome.label`; a failed or inconclusive test never reads PASS."""
    latest = runs.dropna(subset=["profile"]).groupby("profile").tail(1)
    per_run = run_outcomes(rows, tests, latest["run_id"])
    cells = {
        (suite, str(profile)): outcome.label
        for run_id, profile in zip(latest["run_id"], latest["profile"], strict=True)
        for suite, outcome in _worst_by_suite(per_run[str(run_id)]).items()
    }
    if not cells:
        return pd.DataFrame()
    ser = pd.Series(cells)
    ser.index = ser.index.set_names(["suite", "profile"])
    return ser.unstack("profile").fillna("-")


@dataclass(frozen=True)
class TestView:
    """One test of a drill-down: its outcome, the first line of its failure, and its rows."""

    nodeid: str
    outcome: Outcome
    message: str
    rows: pd.DataFrame
    #: what more the test left: a HUNG or CRASHED test's stacks ("" when nothing)
    detail: str = ""


def cell_id(suite: str, run_id: str) -> str:
    """The anchor of one suite of one run: what matrix and grid cells link to."""
    return "cell-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{suite}--{run_id}")


def drill_down(loaded: Loaded, run_id: str) -> dict[str, list[TestView]]:
    """suite -> every qualification test of one run, worst first (rows included; passing tests
    last); the project's self-tests are counted apart (:func:`self_test_health`)."""
    rows = rp.of_origin(_by_run(loaded.rows, [run_id])[run_id], rp.QUALIFICATION)
    tests = rp.of_origin(_by_run(loaded.tests, [run_id])[run_id], rp.QUALIFICATION)
    messages = (
        dict(zip(tests["nodeid"].astype(str), tests["message"].fillna("").astype(str), strict=True))
        if len(tests)
        else {}
    )
    details = (
        # astype first: a report whose results have no detail reads as an all-NaN float column
        dict(zip(tests["nodeid"].astype(str), tests["detail"].astype("string").fillna("").astype(str), strict=True))
        if len(tests) and "detail" in tests
        else {}
    )
    rows_of = {str(k): g for k, g in rows.groupby("nodeid", sort=False)} if len(rows) else {}
    columns = ["metric", "value", "expected", "allowance", "outcome", "note"]
    out: dict[str, list[TestView]] = {}
    for node, (suite, outcome) in rp.frame_test_outcomes(rows, tests).items():
        mine = rows_of[node][columns] if node in rows_of else pd.DataFrame(columns=columns)
        out.setdefault(suite, []).append(TestView(node, outcome, messages.get(node, ""), mine, details.get(node, "")))
    for views in out.values():
        views.sort(key=lambda v: (-v.outcome.severity, v.nodeid))
    return out


def achieved_rates(rows: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """class x speed case x path: achieved TFLOP/s, the device's peak and the fraction of it, from
    the latest run of each hardware class (``<case>.<path>.flops_per_s`` rows)."""
    columns = ["profile", "case", "path", "dtype", "size", "tflops", "peak_tflops", "fraction_of_peak"]
    latest = runs.dropna(subset=["profile"]).groupby("profile").tail(1)
    if not len(latest) or not len(rows):
        return pd.DataFrame(columns=columns)
    chosen = rows[rows["run_id"].isin(set(latest["run_id"])) & rows["metric"].str.endswith(".flops_per_s", na=False)]
    profile_of = dict(zip(latest["run_id"].astype(str), latest["profile"].astype(str), strict=True))
    out = []
    for r in rp.records(chosen):
        case, _, rest = str(r["metric"]).partition(".")
        tags = rp.row_tags(r)
        peak = r.get("expected")
        out.append(
            {
                "profile": profile_of.get(str(r["run_id"])),
                "case": case,
                "path": rest.removesuffix(".flops_per_s"),
                "dtype": r.get("dtype"),
                "size": tags.get("size"),
                "tflops": float(r["value"]) / 1e12,
                "peak_tflops": float(peak) / 1e12 if peak is not None and peak == peak else None,
                "fraction_of_peak": tags.get("fraction_of_peak"),
            }
        )
    return pd.DataFrame(out, columns=columns).sort_values(["profile", "case", "path"]).reset_index(drop=True)


def runs_by_suites(loaded: Loaded) -> pd.DataFrame:
    """runs (oldest first) x suites: each cell the worst outcome of that run's tests of that suite
    (as PyTorch's HUD shows commits x jobs); "-" where the run did not run the suite."""
    per_run = run_outcomes(loaded.rows, loaded.tests, loaded.runs["run_id"])
    records = [
        {"run_id": run_id, **{k: v.label for k, v in _worst_by_suite(outcomes).items()}}
        for run_id, outcomes in per_run.items()
    ]
    return pd.DataFrame(records).set_index("run_id").fillna("-") if records else pd.DataFrame()


def largest_changes(ser: pd.DataFrame, top: int = 20) -> pd.DataFrame:
    """Latest vs previous run of the same profile, by relative change (comparable metrics only:
    a count or a maximum over random samples changes every run and says nothing)."""
    ser = ser[ser["comparable"]] if "comparable" in ser.columns else ser.iloc[:0]
    g = ser.groupby(["profile", "metric_id"], sort=False)
    last = g.tail(1).set_index(["profile", "metric_id"])
    prev = g.nth(-2).set_index(["profile", "metric_id"]) if len(ser) else last.iloc[:0]
    both = last[["value"]].merge(prev[["value"]], left_index=True, right_index=True, suffixes=("", "_previous"))
    both["delta"] = both["value"] - both["value_previous"]
    both["relative"] = both["delta"] / both["value_previous"].abs().where(both["value_previous"] != 0)
    both = both[both["delta"] != 0].dropna(subset=["relative"])  # a change, or nothing
    return both.reindex(both["relative"].abs().sort_values(ascending=False).index).head(top).reset_index()


# -- rendering --------------------------------------------------------------------------------------
#: Trend plots drawn: flagged metrics first, then the largest changes, up to this many.
MAX_PLOTS = 24


def _svg(fig: Any, titles: dict[str, str]) -> str:
    """The figure as inline SVG (vector: crisp at any browser zoom), each point's ``<title>`` its
    hover text: run, time, commit and value (``titles``: gid -> text)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]  # inline in the page: no XML declaration or doctype
    for gid, title in titles.items():
        svg = svg.replace(f'<g id="{gid}">', f'<g id="{gid}"><title>{html.escape(title)}</title>', 1)
    return svg


def nonfinite_note(values: Sequence[float]) -> str:
    """What a trend plot says about its inf/NaN points (drawn as red markers at the top edge)."""
    bad = [v for v in values if not math.isfinite(v)]
    if not bad:
        return ""
    kinds = ", ".join(sorted({str(v) for v in bad}))
    return f"{len(bad)} of {len(values)} point(s) {kinds}: red x at the top edge"


def _plots(ser: pd.DataFrame, metrics: Sequence[str], flagged: pd.DataFrame | None = None) -> list[tuple[str, str]]:
    """One trend plot per metric: x by run time (commit under the time where known), inf/NaN
    drawn as red markers at the top edge with a note, and the allowance band of a comparable
    metric (around the reference of its latest point) shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: small, selectable
    matplotlib.rcParams["svg.hashsalt"] = "amp-harness"  # stable ids between renders

    refs: dict[tuple[Any, str], float | None] = {}
    if flagged is not None:
        for profile, metric, reference in zip(
            flagged["profile"], flagged["metric_id"], flagged["reference"], strict=True
        ):
            refs[(profile, str(metric))] = finite_or_none(reference)
    out = []
    for plot, m in enumerate(metrics):
        titles: dict[str, str] = {}
        fig, ax = plt.subplots(figsize=(5.5, 2.6))
        fig.subplots_adjust(left=0.12, right=0.98, top=0.82, bottom=0.3)  # fixed margins: one draw per plot
        notes = []
        for profile, g in ser[ser["metric_id"] == m].groupby("profile"):
            x = (
                pd.to_datetime(g["started"], errors="coerce", utc=True, format="ISO8601")
                if g["started"].notna().any()
                else None
            )
            xs: list[Any] = list(x) if x is not None and x.notna().all() else list(range(len(g)))
            ys = g["value"].to_numpy(dtype=float)
            finite = [math.isfinite(v) for v in ys]
            ax.plot(
                [a for a, f in zip(xs, finite, strict=True) if f],
                [v for v, f in zip(ys, finite, strict=True) if f],
                marker="o",
                ms=3,
                label=str(profile),
            )
            bad = [(a, v) for a, v, f in zip(xs, ys, finite, strict=True) if not f]
            if bad:
                # at the top edge of the axes whatever the data's range: never mistaken for a value
                ax.plot(
                    [a for a, _ in bad], [0.97] * len(bad), "x", color="red", ms=7, transform=ax.get_xaxis_transform()
                )
                notes.append(nonfinite_note([float(v) for v in ys]))
            drift = g["drift"].iloc[-1] if "drift" in g else None
            ref = refs.get((profile, m))
            if ref is None and bool(g["comparable"].iloc[-1]) and len(g) > 1:
                prev = [v for v in g["value"].iloc[-1 - WINDOW : -1] if math.isfinite(v)]
                ref = statistics.median(prev) if prev else None
            b = band(ref, None if pd.isna(drift) else float(drift)) if ref is not None else None
            if b is not None:
                lo, hi = b
                if lo == hi:
                    ax.axhline(lo, color="green", alpha=0.5, lw=1)
                else:
                    ax.axhspan(lo, hi, color="green", alpha=0.15, label="allowed")
            commits = [c if isinstance(c, str) else "" for c in (g["commit"].tolist() if "commit" in g else [])]
            for k, (a, v, f) in enumerate(zip(xs, ys, finite, strict=True)):
                if not f:
                    continue
                gid = f"p{plot}-{len(titles)}"
                ax.plot([a], [v], "o", ms=7, alpha=0.0, gid=gid)  # the hover target of one point
                when = g["started"].iloc[k] if "started" in g else ""
                commit = commits[k][:8] if k < len(commits) and commits[k] else "?"
                run = str(g["run_id"].iloc[k])
                titles[gid] = f"{profile!s}: {v:.6g} (run {run}, {when!s}, commit {commit})"
            if x is not None and x.notna().all() and any(commits):
                step = max(1, -(-len(xs) // 8))  # at most 8 labelled runs
                ax.set_xticks(xs[::step])
                ax.set_xticklabels(
                    [f"{t:%m-%d %H:%M}\n{c[:7]}" for t, c in list(zip(x, commits, strict=True))[::step]],
                    fontsize=5,
                    rotation=30,
                )
        title = m if not notes else f"{m}\n" + "; ".join(notes)
        ax.set_title(title, fontsize=7)
        ax.set_xlabel("run time (commit)", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6, loc="upper left")  # "best" searches every point: slow on a fleet
        if not ax.lines and not ax.patches:
            ax.text(0.5, 0.5, "no finite values", ha="center", transform=ax.transAxes)
        out.append((m, _svg(fig, titles)))
        plt.close(fig)
    return out


def stacks_view(loaded: Loaded) -> pd.DataFrame:
    """The latest run of each (torch release, hardware class) side by side: per suite, what
    ``amp-harness diff`` says of it against its class's reference column (the oldest torch release's
    latest run on the same hardware class)."""

    runs = loaded.runs.dropna(subset=["run_id"])
    if runs.empty:
        return pd.DataFrame()
    latest = runs.groupby(["torch", "profile"], dropna=False, sort=False).tail(1)

    def key(r: Any) -> tuple[tuple[int, ...], str]:
        torch = str(r["torch"]) if isinstance(r["torch"], str) else "0"
        try:
            return release(torch), str(r["profile"])
        except ValueError:
            return (0,), str(r["profile"])

    ordered = sorted((r for _, r in latest.iterrows()), key=key)

    def side(r: Any, label: str) -> df_.Side:
        meta = {
            "run_id": r["run_id"],
            "git_commit": r.get("commit"),
            "primary_device": r.get("device"),
            "fingerprint": {"torch_version": r.get("torch"), "cpu_class": {"id": r.get("profile")}},
        }
        rows = loaded.rows[loaded.rows["run_id"] == r["run_id"]]
        if len(loaded.tests):  # each test's own verdict, as diff reads it from a report
            tests = loaded.tests[loaded.tests["run_id"] == r["run_id"]].drop(columns=["run_id"])
            meta["test_results"] = rp.records(tests)
        return df_.Side(label, rp.LoadedReport(Path(str(r["run_id"])), rows, meta))

    columns: dict[str, dict[str, str]] = {}
    for r in ordered:
        # the class's oldest torch release (a run that names no class is compared with its like: str, as NaN != NaN)
        ref = next(o for o in ordered if str(o["profile"]) == str(r["profile"]))
        name = f"torch {r['torch']} / {r['profile']}"
        if ref["run_id"] == r["run_id"]:
            suites = sorted(set(loaded.rows.loc[loaded.rows["run_id"] == r["run_id"], "suite"].dropna()))
            columns[name] = {suite: "reference" for suite in suites}
            continue
        d = df_.diff(side(ref, "A"), side(r, "B"))
        cells: dict[str, str] = {}
        for suite in sorted({c.suite for c in d.changes}):
            counts = {s: sum(1 for c in d.changes if c.suite == suite and c.status is s) for s in df_.Status}
            listed = [f"{n} {s.value}" for s, n in counts.items() if n and s is not df_.Status.UNCHANGED]
            cells[suite] = ", ".join(listed) or "unchanged"
        for suite, only in d.skipped_suites:
            cells[suite] = f"only in {'this run' if only == 'B' else 'the reference'}"
        columns[f"{name} (vs torch {ref['torch']})"] = cells
    return pd.DataFrame(columns).rename_axis("suite").reset_index().fillna("-")


def _table(df: pd.DataFrame, cls: str = "") -> str:
    return df.to_html(index=False, classes=cls, border=0, na_rep="", float_format=lambda v: f"{v:.6g}", escape=True)


CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
th{background:#f0f0f0}.FAIL,.regression,.o-fail{background:#f8c8c8}.o-inconclusive{background:#f3d0f0}
.o-crashed,.o-hung{background:#e07070;font-weight:bold}.suspicious,.NOISY,.o-noisy{background:#fbe8b0}.o-unjudged{background:#e8e8f8}.o-known{background:#e0f0f8}
.PASS,.ok,.o-pass{background:#d4efd4}.plots figure{display:inline-block;margin:4px}.plots img{border:1px solid #ddd}
.problems{color:#a00}details{margin:4px 0}details>summary{cursor:pointer}.test{margin:6px 0 6px 1em}
.message{font-family:monospace;white-space:pre-wrap;color:#700}:target{outline:2px solid #36c}"""

#: Opens the drill-down a cell link points at (on load and on every link followed).
OPEN_TARGET = (
    "<script>function openTarget(){var e=document.getElementById(decodeURIComponent(location.hash.slice(1)));"
    "if(e&&e.tagName==='DETAILS'){e.open=true;}}window.addEventListener('hashchange',openTarget);openTarget();"
    "</script>"
)


def _outcome_cell(label: str, anchor: str | None) -> str:
    """A table cell for an outcome label, coloured by its outcome, linking to ``anchor``."""
    outcome = next((o for o in Outcome if o.label == label), None)
    cls = f" class='o-{outcome.value}'" if outcome is not None else ""
    text = html.escape(label)
    inner = text if anchor is None else "<a href='#" + anchor + "'>" + text + "</a>"
    return f"<td{cls}>{inner}</td>"


def _linked_grid(grid: pd.DataFrame, run_of_column: dict[str, str] | None, head: str) -> str:
    """A suite grid whose cells link to their drill-downs: columns are runs (``run_of_column``
    maps a column to its run) or the index is runs."""
    cols = list(grid.columns)
    out = [f"<table class='grid'><tr><th>{html.escape(head)}</th>"]
    out += [f"<th>{html.escape(str(c))}</th>" for c in cols] + ["</tr>"]
    for key, row in grid.iterrows():
        out.append(f"<tr><th>{html.escape(str(key))}</th>")
        for c in cols:
            label = str(row[c])
            if run_of_column is not None:
                suite, run_id = str(key), run_of_column[str(c)]
            else:
                suite, run_id = str(c), str(key)
            out.append(_outcome_cell(label, None if label == "-" else cell_id(suite, run_id)))
        out.append("</tr>")
    return "".join(out) + "</table>"


def _drill_downs(loaded: Loaded) -> str:
    parts = []
    for run_id, profile in zip(loaded.runs["run_id"], loaded.runs["profile"], strict=True):
        for suite, views in sorted(drill_down(loaded, str(run_id)).items()):
            worst = views[0].outcome
            counts: dict[str, int] = {}
            for v in views:
                counts[v.outcome.label] = counts.get(v.outcome.label, 0) + 1
            summary = ", ".join(f"{n} {label}" for label, n in counts.items())
            parts.append(
                f"<details id='{cell_id(suite, str(run_id))}'><summary><b>{html.escape(suite)}</b> in run "
                f"{html.escape(str(run_id))} ({html.escape(str(profile))}): "
                f"<span class='o-{worst.value}'>{worst.label}</span>; {len(views)} tests: {html.escape(summary)}"
                "</summary>"
            )
            shown = [v for v in views if v.outcome.severity > Outcome.PASS.severity]
            for v in shown:
                parts.append(
                    f"<div class='test'><span class='o-{v.outcome.value}'>{v.outcome.label}</span> "
                    f"<code>{html.escape(v.nodeid)}</code>"
                    + (f"<div class='message'>{html.escape(v.message)}</div>" if v.message else "")
                    + (
                        f"<details><summary>stacks</summary><pre>{html.escape(v.detail)}</pre></details>"
                        if v.detail and v.outcome.broke
                        else ""
                    )
                    + (_table(v.rows, "rows") if len(v.rows) else "")
                    + "</div>"
                )
            if not shown:
                parts.append("<p class='test'>every test passed (or judged nothing, or skipped)</p>")
            parts.append("</details>")
    return "\n".join(parts)


def known_answer_outliers(loaded: Loaded) -> pd.DataFrame:
    """The known answers' fleet outliers (:func:`harness.domains.known_answers.fleet.outliers`) of
    the loaded runs: each row of a known answer carries its digest and computation in its tags."""
    from harness.domains.known_answers import fleet as ka_fleet  # lazy: the rule, on plain records

    rows = loaded.rows
    if not len(rows) or "tags" not in rows.columns:
        return pd.DataFrame()
    runs: dict[str, dict[Any, Any]] = {str(r["run_id"]): r for r in loaded.runs.to_dict("records")}
    seen = []
    for r in rows[rows["metric"].astype(str).str.startswith("baseline.")].itertuples():
        tags = json.loads(str(r.tags)) if isinstance(r.tags, str) and r.tags else {}
        run = runs.get(str(r.run_id))
        if "sha256" not in tags or "computation" not in tags or run is None:
            continue
        seen.append(
            ka_fleet.Observation(
                str(tags.get("hardware_class") or run.get("profile")),
                str(run.get("torch")),
                str(tags["computation"]),
                str(run.get("host") or "unknown"),
                str(run.get("started")),
                str(tags["sha256"]),
            )
        )
    found = ka_fleet.outliers(seen)
    return pd.DataFrame(
        [
            {
                "hardware_class": o.hardware_class,
                "torch": o.stack,
                "computation": o.computation,
                "host": o.host,
                "digest": o.digest[:12],
                "majority": o.majority[:12] if o.majority else "no majority",
                "hosts agreeing": f"{o.hosts_agreeing} of {o.hosts}",
                "runs disagreeing": f"{o.runs_disagreeing} of {o.runs}",
            }
            for o in found
        ]
    )


def render(loaded: Loaded, window: int = WINDOW, min_history: int = MIN_HISTORY, max_plots: int = MAX_PLOTS) -> str:
    ser = series(loaded.rows, loaded.runs)
    fl = flags(ser, window, min_history)
    matrix = pass_fail_matrix(loaded.rows, loaded.runs, loaded.tests)
    changes = largest_changes(ser)
    flagged = fl[fl["flag"].isin(["regression", "suspicious"])]
    chosen = list(dict.fromkeys([*flagged["metric_id"], *changes["metric_id"]]))[:max_plots]
    plots = _plots(ser, chosen, flagged)
    comparable = int(ser.loc[ser["comparable"], "metric_id"].nunique()) if len(ser) else 0
    counts = fl["flag"].value_counts().to_dict()
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>amp-harness dashboard</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>amp-harness regression dashboard</h1>",
        f"<p>{len(loaded.runs)} runs, {ser['metric_id'].nunique()} metrics ({comparable} comparable, flagged by "
        "their rule; the rest information, never flagged); flags: "
        + ", ".join(f"{html.escape(str(k))}: {v}" for k, v in sorted(counts.items()))
        + "</p>",
    ]
    if loaded.fleet_runs is not None:
        parts.append(
            f"<p>Drawn from a fleet dataset of {loaded.fleet_runs} runs: the latest {window + 1} of each hardware "
            "class and stack.</p>"
        )
    if loaded.problems:
        parts.append(
            "<h2>Reports skipped</h2><ul class='problems'>"
            + "".join(f"<li>{html.escape(p)}</li>" for p in loaded.problems)
            + "</ul>"
        )
    parts += ["<h2>Runs</h2>", _table(loaded.runs, "runs")]
    latest = loaded.runs.dropna(subset=["profile"]).groupby("profile").tail(1)
    run_of_profile = dict(zip(latest["profile"].astype(str), latest["run_id"].astype(str), strict=True))
    parts += [
        "<h2>Pass/fail matrix (latest run of each profile; a cell opens its tests below)</h2>",
        _linked_grid(matrix, run_of_profile, "suite") if len(matrix) else "<p>no tests</p>",
    ]
    health = self_test_health(loaded.rows, loaded.runs, loaded.tests)
    if health:
        parts += [
            "<p class='self-tests'>The project's tests of itself (not the stack's qualification): "
            + "; ".join(html.escape(h) for h in health)
            + "</p>"
        ]
    grid = runs_by_suites(loaded)
    parts += [
        "<h2>Runs x suites (oldest first; each cell the worst outcome of that run's tests of the suite)</h2>",
        _linked_grid(grid, None, "run") if len(grid) else "<p>no tests</p>",
        "<h2>Drill-down (the tests of each suite and run that did not pass, worst first, with their rows)</h2>",
        _drill_downs(loaded),
    ]
    parts += [
        f"<h2>Regression flags (comparable metrics: median of the previous {window} runs, any change of a "
        "deterministic value or a move beyond a statistic's drift; 2 violating points in a row = regression)</h2>",
        _table(flagged.sort_values(["flag", "metric_id"]), "flags") if len(flagged) else "<p>none</p>",
    ]
    odd = known_answer_outliers(loaded)
    parts += [
        "<h2>Known-answer outliers (per hardware class and stack: hosts whose latest known answers disagree with "
        "the majority of hosts, and how many of their runs disagreed)</h2>",
        _table(odd, "outliers") if len(odd) else "<p>none: every host gives its class's majority answers</p>",
    ]
    rates = achieved_rates(loaded.rows, loaded.runs)
    parts += [
        "<h2>Achieved rate (latest run of each hardware class: each speed case's TFLOP/s per path and its "
        "fraction of the device's peak for that dtype)</h2>",
        _table(rates, "rates") if len(rates) else "<p>no speed case with a FLOP count ran</p>",
    ]
    stacks = stacks_view(loaded)
    parts += [
        "<h2>Stacks (latest run of each torch release and hardware class; statuses of amp-harness diff "
        "against the reference column)</h2>",
        _table(stacks, "stacks") if len(stacks.columns) > 2 else "<p>one stack only</p>",
    ]
    parts += [
        "<h2>Largest changes since the previous run</h2>",
        _table(changes, "changes") if len(changes) else "<p>none: no comparable metric changed</p>",
    ]
    parts += ["<h2>Trends</h2><div class='plots'>"]
    parts += [f"<figure title='{html.escape(m)}'>{svg}</figure>" for m, svg in plots]
    parts += ["</div>", OPEN_TARGET, "</body></html>"]
    out = "\n".join(parts)
    # colour cells by their text (no scripts): wrap known words
    for word in (Outcome.FAIL.label, Outcome.PASS.label, Outcome.NOISY.label, "regression", "suspicious"):
        out = out.replace(f"<td>{word}</td>", f"<td class='{word}'>{word}</td>")
    return out


def write_dashboard(
    paths: Iterable[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    fleet: str | os.PathLike[str] | None = None,
    **kw: Any,
) -> Loaded:
    """Render the dashboard of report directories, or of a fleet dataset (``fleet``)."""
    loaded = load_fleet(fleet, kw.get("window", WINDOW)) if fleet is not None else load_reports(paths)
    text = render(loaded, **kw)
    atomic.write_text(Path(output), text)
    return loaded
