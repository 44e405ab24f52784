"""The run report: every measurement as a tidy row, written as parquet + CSV + run metadata.

Layout of one run (``<report-dir>/<run_id>/``)::

    rows.parquet   one row per recorded measurement (COLUMNS), pyarrow
    rows.csv       the same rows, for eyes and spreadsheets
    run.json       run metadata: schema version, environment fingerprint, options, times, and
                   each test's own result (``test_results``: TEST_COLUMNS)

:func:`load` gives them back as pandas objects; dashboards concatenate many runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

# Outcome and OUTCOMES are re-exported: the report's outcome column holds their values.
from harness.numerics.verdict import OUTCOMES as OUTCOMES
from harness.numerics.verdict import Outcome as Outcome
from harness.numerics.verdict import RowKind
from harness.storage import atomic

if TYPE_CHECKING:
    import pandas as pd
    from typing_extensions import Unpack

#: 2: the ``unjudged`` outcome (measured, nothing to judge it against yet). 3: the
#: ``inconclusive`` outcome (a check that tested nothing it claims), and the ``comparable`` and
#: ``drift`` columns. Earlier versions load: their rows use a subset of the outcomes, and without
#: the columns every row reads as information (shown by the dashboard, never flagged).
#: 4: each test's own result in the run metadata (``test_results``), beside its rows, and the
#: ``kind`` column (RowKind); earlier reports get their kind from the metric's name on loading,
#: the rule readers applied before (``policy.*``, ``known_issue.*``, ``*.speedup``).
#: 5: test results may be ``hung`` or ``crashed`` (a test stopped at its time limit, or during which
#: its process died), with ``detail`` (the stacks of its threads) and ``capability``; a run made
#: from a dead session's journal says so in its metadata (``interrupted``).
SCHEMA_VERSION = 5
READABLE_SCHEMAS = (1, 2, 3, 4, 5)
#: A test's result: pytest's outcome (passed, failed, error, skipped, xfailed, xpassed) or the
#: harness's (hung, crashed), its duration, the first line of its failure or skip reason, and its
#: verdict (an Outcome value: the test's result together with the outcomes of the rows it
#: recorded, Outcome.of_test); what more it left (a hung test's stacks), and the capability it decides.
TEST_COLUMNS = ("nodeid", "suite", "result", "duration_s", "message", "verdict", "detail", "capability")
#: Where a row or test result comes from: the qualification (the stack's suites, a user's checks)
#: or the tested project's own self-tests (the harness's tests of itself, in this repository). Run
#: metadata names the self-tests' node-id prefixes (:data:`SELF_TESTS`, from the pytest ini option
#: ``amp_self_tests``); loading derives the ``origin`` column of rows and test results from them.
QUALIFICATION, SELF_TEST = "qualification", "self-test"
SELF_TESTS = "self_tests"
ROWS_PARQUET = "rows.parquet"
ROWS_CSV = "rows.csv"
RUN_JSON = "run.json"
#: Files beside the rows (a failed check's saved inputs, for ``amp-harness repro``); rows name them.
ATTACHMENTS = "attachments"


@dataclass(frozen=True)
class Row:
    """One measurement. ``value``/``expected``/``allowance`` are numbers in ``unit``."""

    run_id: str
    nodeid: str
    suite: str
    check: str
    metric: str
    value: float | None
    unit: str = ""
    expected: float | None = None
    allowance: float | None = None
    outcome: Outcome = Outcome.INFO
    dtype: str = ""
    device: str = ""
    profile: str = ""
    tags: str = "{}"
    note: str = ""
    recorded_at: str = ""
    #: a comparable measurement (deterministic on its stack, or a statistic with a stated run-to-run
    #: drift) whose change between runs means something; False: information (counts, maxima over
    #: random samples, unjudged timings, intermediate values), shown but never flagged
    comparable: bool = False
    #: for comparable rows: the relative run-to-run change that is still "the same" (0: deterministic)
    drift: float | None = None
    #: what the row is (:class:`~harness.numerics.verdict.RowKind`): a measurement, a speedup, an
    #: autocast policy cell, a known issue
    kind: str = RowKind.MEASUREMENT.value

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome.parse(self.outcome))

    def as_dict(self) -> dict[str, Any]:
        """Plain values (the outcome as its string), as stored in the report."""
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d


COLUMNS: tuple[str, ...] = tuple(Row.__dataclass_fields__)
#: the columns of a loaded report's rows: the stored ones and ``origin`` (derived, :func:`with_origin`)
LOADED_COLUMNS: tuple[str, ...] = (*COLUMNS, "origin")


class RowFields(TypedDict, total=False):
    """What a recorder says of one measurement beyond its metric and value, as it may say it (a
    dtype or device object, tags as a dict): the one declaration of a row's keywords. The plugin's
    recorder passes them through untouched, so a new column is a field of :class:`Row` and a key
    here, in this module alone."""

    check: str | None
    unit: str
    expected: float | None
    allowance: float | None
    outcome: Outcome | str
    dtype: object
    device: object
    tags: dict[str, Any] | None
    note: str
    comparable: bool | None
    drift: float | None
    kind: RowKind | str


def make_row(
    *,
    run_id: str,
    nodeid: str,
    suite: str,
    metric: str,
    value: float | int | bool | None,
    profile: str = "",
    **fields: Unpack[RowFields],
) -> Row:
    """Build a row, normalising dtypes/devices to strings and tags to sorted JSON.

    ``comparable`` defaults to whether the row is judged (pass, fail, or a known finding: values a
    verdict was decided on, deterministic on their stack unless ``drift`` says how much they move);
    information, unjudged, noisy, skipped and inconclusive rows are not comparable."""
    unknown = sorted(set(fields) - set(RowFields.__annotations__))
    if unknown:
        raise TypeError(
            f"no report column {', '.join(unknown)}; a row's keywords: {', '.join(RowFields.__annotations__)}"
        )
    outcome = Outcome.parse(fields.get("outcome", Outcome.INFO))
    comparable = fields.get("comparable")
    is_comparable = outcome.judged if comparable is None else comparable
    drift = fields.get("drift")
    expected, allowance = fields.get("expected"), fields.get("allowance")
    return Row(
        run_id=run_id,
        nodeid=nodeid,
        suite=suite,
        check=fields.get("check") or "",
        metric=metric,
        value=None if value is None else float(value),
        unit=fields.get("unit", ""),
        expected=None if expected is None else float(expected),
        allowance=None if allowance is None else float(allowance),
        outcome=outcome,
        dtype=str(fields.get("dtype", "")).removeprefix("torch."),
        device=str(fields.get("device", "")),
        profile=profile,
        tags=json.dumps(fields.get("tags") or {}, sort_keys=True, default=str),
        note=fields.get("note", ""),
        recorded_at=now_iso(),
        comparable=is_comparable,
        drift=(drift if drift is not None else 0.0) if is_comparable else None,
        kind=RowKind(fields.get("kind", RowKind.MEASUREMENT)).value,
    )


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + os.urandom(3).hex()


def _frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    import pandas as pd

    df = pd.DataFrame(list(rows), columns=list(COLUMNS))
    for col in NUMERIC_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="raise").astype("float64")
    df["comparable"] = df["comparable"].fillna(False).astype("bool")
    for col in COLUMNS:
        if col not in (*NUMERIC_COLUMNS, "comparable"):
            df[col] = df[col].astype("string")
    return df


NUMERIC_COLUMNS = ("value", "expected", "allowance", "drift")


def write(
    report_dir: Path,
    run_id: str,
    rows: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    attachments: Mapping[str, bytes] | None = None,
) -> Path:
    """Write one run atomically: into a temporary directory, renamed into place at the end;
    ``attachments`` (name relative to the run directory: bytes) go in with it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    final = report_dir / run_id
    with atomic.directory(final) as tmp:
        df = _frame(rows)
        full_meta = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "rows": len(df), **meta}
        table = pa.Table.from_pandas(df, preserve_index=False)
        table = table.replace_schema_metadata(
            {
                **(table.schema.metadata or {}),
                b"amp_harness": json.dumps({"schema_version": SCHEMA_VERSION, "run_id": run_id}).encode(),
            }
        )
        pq.write_table(table, tmp / ROWS_PARQUET)
        df.to_csv(tmp / ROWS_CSV, index=False)
        (tmp / RUN_JSON).write_text(
            json.dumps(full_meta, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8"
        )
        for name, data in (attachments or {}).items():
            path = tmp / name
            if path.resolve().parent != (tmp / ATTACHMENTS).resolve():
                raise ValueError(f"attachment {name!r} must lie in {ATTACHMENTS}/")
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)
    return final


def hardware_class(meta: dict[str, Any]) -> str | None:
    """The hardware class a run measured on (its primary device's), from its run metadata; else its
    ISA profile; None when it names neither (``cpu-amd-zen4-f25m17-avx512bf16-t2``, not ``cpu-avx512bf16``)."""
    fp = meta.get("fingerprint") or {}
    device = str(meta.get("primary_device") or "cpu")
    cls = fp.get("cuda_class" if device.startswith("cuda") else "cpu_class") if isinstance(fp, dict) else None
    if isinstance(cls, dict) and cls.get("id"):
        return str(cls["id"])
    profile = meta.get("profile")
    return None if profile is None else str(profile)


def self_test_prefixes(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The node-id prefixes of the run's self-tests (none for a run that names none)."""
    found = meta.get(SELF_TESTS) or ()
    return tuple(str(p) for p in found) if isinstance(found, list | tuple) else ()


def origin_of(nodeid: str, prefixes: Sequence[str]) -> str:
    """:data:`SELF_TEST` for a node id under one of ``prefixes`` (``tests/``), else :data:`QUALIFICATION`."""
    return SELF_TEST if any(nodeid.startswith(p) for p in prefixes) else QUALIFICATION


def with_origin(df: pd.DataFrame, meta: Mapping[str, Any]) -> pd.DataFrame:
    """``df`` (rows or test results) with its ``origin`` column, from the run's self-test prefixes."""
    import pandas as pd

    prefixes = self_test_prefixes(meta)
    df["origin"] = pd.Series([origin_of(str(n), prefixes) for n in df["nodeid"]], index=df.index, dtype="string")
    return df


def of_origin(df: pd.DataFrame, origin: str) -> pd.DataFrame:
    """The part of a rows or tests frame of one origin (a frame without the column is all qualification)."""
    if "origin" not in df.columns or df.empty:
        return df if origin == QUALIFICATION else df.iloc[:0]
    return df[df["origin"].fillna(QUALIFICATION) == origin]


def qualification(df: pd.DataFrame) -> pd.DataFrame:
    """The qualification's part of a frame (:func:`of_origin`)."""
    return of_origin(df, QUALIFICATION)


class ReportError(Exception):
    """A report that cannot be loaded; names the file."""


@dataclass(frozen=True)
class LoadedReport:
    path: Path
    rows: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def tests(self) -> pd.DataFrame:
        """Each test's own result (:data:`TEST_COLUMNS`, and its ``origin``); empty for reports
        before schema 4."""
        import pandas as pd

        return with_origin(
            pd.DataFrame(list(self.meta.get("test_results") or []), columns=list(TEST_COLUMNS)), self.meta
        )

    @property
    def run(self) -> pd.DataFrame:
        """The run metadata as a one-row DataFrame (nested values flattened with '.')."""
        import pandas as pd

        return pd.json_normalize(self.meta)


def load(path: str | os.PathLike[str]) -> LoadedReport:
    """Load one run report from its directory (or its ``rows.parquet``)."""
    import pandas as pd

    p = Path(path)
    run_dir = p.parent if p.is_file() else p
    parquet = run_dir / ROWS_PARQUET
    meta_file = run_dir / RUN_JSON
    if not parquet.is_file():
        raise ReportError(f"{run_dir}: no {ROWS_PARQUET} (is this an amp-harness run report directory?)")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file.is_file() else {}
    except ValueError as exc:
        raise ReportError(f"{meta_file}: corrupt run metadata ({exc})") from None
    version = meta.get("schema_version", SCHEMA_VERSION)
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise ReportError(
            f"{meta_file}: report schema version {version} is newer than this harness reads ({SCHEMA_VERSION})"
        )
    if version not in READABLE_SCHEMAS:
        raise ReportError(
            f"{meta_file}: report schema version {version!r} is not one this harness reads "
            f"({', '.join(map(str, READABLE_SCHEMAS))})"
        )
    try:
        rows = pd.read_parquet(parquet)
    except Exception as exc:  # pyarrow raises several unrelated types for damaged files
        raise ReportError(f"{parquet}: unreadable parquet ({exc})") from None
    if "comparable" not in rows.columns:  # before schema 3: information only
        rows["comparable"] = False
    if "drift" not in rows.columns:
        rows["drift"] = float("nan")
    if "kind" not in rows.columns:  # before schema 4: the kind its metric's name implied
        rows["kind"] = rows["metric"].astype(str).map(legacy_kind)
    return LoadedReport(run_dir, with_origin(rows, meta), meta)


def legacy_kind(metric: str) -> str:
    """The kind of a row written before the ``kind`` column, from its metric's name."""
    if metric.startswith("policy."):
        return RowKind.POLICY.value
    if metric.startswith("known_issue."):
        return RowKind.KNOWN_ISSUE.value
    if metric.endswith(".speedup"):
        return RowKind.SPEEDUP.value
    return RowKind.MEASUREMENT.value


def find_runs(report_dir: str | os.PathLike[str]) -> list[Path]:
    """Run directories under a report directory, oldest first."""
    root = Path(report_dir)
    return sorted(
        p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / ROWS_PARQUET).is_file()
    )


def newest_run(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it is a run report, else the newest run in it (a report directory);
    ReportError when it holds none."""
    p = Path(path)
    if (p / ROWS_PARQUET).is_file() or p.is_file():
        return p
    runs = find_runs(p) if p.is_dir() else []
    if not runs:
        raise ReportError(f"{p} holds no run report (no */{ROWS_PARQUET})")
    return runs[-1]


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """A report frame's rows (or test results) as dicts with string keys."""
    return [{str(k): v for k, v in r.items()} for r in df.to_dict("records")]


def test_outcomes(
    rows: Iterable[Mapping[str, Any]], tests: Iterable[Mapping[str, Any]]
) -> dict[str, tuple[str, Outcome]]:
    """node id -> (suite, outcome) of every test in a run: the test's own verdict where the report
    has it (its result read with its rows: a test that expected a failing row and passed is a
    pass, a failed test is never one), else the worst of its rows (reports before schema 4)."""
    out: dict[str, tuple[str, Outcome]] = {}
    for t in tests:
        out[str(t["nodeid"])] = (str(t["suite"]), Outcome.parse(str(t["verdict"])))
    from_rows: dict[str, tuple[str, list[str]]] = {}
    for r in rows:
        node = str(r["nodeid"])
        if node not in out:
            from_rows.setdefault(node, (str(r["suite"]), []))[1].append(str(r["outcome"]))
    for node, (suite, outcomes) in from_rows.items():
        worst = Outcome.worst(outcomes)
        if worst is not None:
            out[node] = (suite, worst)
    return out


def row_tags(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's tags as a dict (its JSON column); {} where they are missing or not an object."""
    try:
        tags = json.loads(str(row.get("tags") or "{}"))
    except ValueError:
        return {}
    return tags if isinstance(tags, dict) else {}


def frame_test_outcomes(rows: pd.DataFrame, tests: pd.DataFrame) -> dict[str, tuple[str, Outcome]]:
    """:func:`test_outcomes` of a report's frames, reading only the columns it uses (the dashboard
    calls it per run of a fleet: whole rows as dicts cost seconds there)."""
    row_columns = [c for c in ("nodeid", "suite", "outcome") if c in rows.columns]
    test_columns = [c for c in ("nodeid", "suite", "verdict") if c in tests.columns]
    return test_outcomes(records(rows[row_columns]), records(tests[test_columns]))


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, int]:
    counts = {o: 0 for o in OUTCOMES}
    for r in rows:
        counts[str(r["outcome"])] += 1
    return counts
