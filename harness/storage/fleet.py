"""A fleet's run reports as one partitioned parquet dataset.

Every machine that qualifies a stack publishes its run (``amp-harness publish RUN --fleet DIR``)
into a shared directory laid out as hive partitions::

    DIR/hardware_class=<class>/stack=torch-<minor>/date=<YYYY-MM-DD>/<run_id>.parquet

One file per run holds the run's rows; the run's metadata (run.json) rides in the file's parquet
metadata. Readers never load the whole fleet: the partition directories and file names say which
class, stack, day and run each file is (run ids start with their UTC start time, so they sort by
time), and only the files a view needs are opened. ``pyarrow.dataset`` reads the same layout
(``partitioning="hive"``) for ad-hoc queries over all of it.

Writes are atomic (a temporary file in the partition, renamed into place), so a reader never sees a
half-written run and two machines publishing at once do not collide (run ids are unique).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.domains.versions import minor
from harness.storage import report as rp

META_KEY = b"amp_harness_run"
_SAFE = re.compile(r"[^A-Za-z0-9_.+\-]+")


def _part(value: object) -> str:
    return _SAFE.sub("_", str(value)).strip("_") or "unknown"


@dataclass(frozen=True)
class FleetRun:
    """One published run, as its path names it (nothing read from the file)."""

    hardware_class: str
    stack: str
    date: str
    run_id: str
    path: Path


def stack_of(meta: dict[str, Any]) -> str:
    """``torch-2.13`` from a run's metadata (its fingerprint's torch version)."""

    fp = meta.get("fingerprint") or {}
    version = fp.get("torch_version") if isinstance(fp, dict) else None
    try:
        return f"torch-{minor(str(version))}"
    except ValueError:
        return "torch-unknown"


def class_of(meta: dict[str, Any]) -> str:
    """The partition a run lands in: its hardware class (:func:`report.hardware_class`) or "unknown"."""
    return rp.hardware_class(meta) or "unknown"


def publish(run: rp.LoadedReport, root: str | os.PathLike[str]) -> Path:
    """Write one run into the fleet dataset at ``root``; returns the file written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = dict(run.meta)
    run_id = str(meta.get("run_id") or run.path.name)
    started = str(meta.get("started") or "")
    date = started[:10] if re.match(r"\d{4}-\d{2}-\d{2}", started) else run_id[:8]
    if re.match(r"\d{8}$", date):
        date = f"{date[:4]}-{date[4:6]}-{date[6:]}"
    part = (
        Path(root)
        / f"hardware_class={_part(class_of(meta))}"
        / f"stack={_part(stack_of(meta))}"
        / f"date={_part(date)}"
    )
    part.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(run.rows, preserve_index=False)
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), META_KEY: json.dumps(meta, default=str).encode()}
    )
    final = part / f"{_part(run_id)}.parquet"
    tmp = part / f".{final.name}.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, final)
    return final


def index(root: str | os.PathLike[str]) -> list[FleetRun]:
    """Every published run, from directory and file names only, oldest first."""
    out: list[FleetRun] = []
    base = Path(root)
    if not base.is_dir():
        raise FileNotFoundError(
            f"{base}: no fleet dataset here (publish a run with `amp-harness publish RUN --fleet {base}`)"
        )
    for cls_dir in _dirs(base, "hardware_class="):
        for stack_dir in _dirs(cls_dir, "stack="):
            for date_dir in _dirs(stack_dir, "date="):
                with os.scandir(date_dir) as it:
                    for e in it:
                        if e.name.endswith(".parquet") and not e.name.startswith("."):
                            out.append(
                                FleetRun(
                                    cls_dir.name.split("=", 1)[1],
                                    stack_dir.name.split("=", 1)[1],
                                    date_dir.name.split("=", 1)[1],
                                    e.name.removesuffix(".parquet"),
                                    Path(e.path),
                                )
                            )
    out.sort(key=lambda r: (r.date, r.run_id))
    return out


def _dirs(parent: Path, prefix: str) -> Iterator[Path]:
    with os.scandir(parent) as it:
        for e in it:
            if e.is_dir() and e.name.startswith(prefix):
                yield Path(e.path)


def load(run: FleetRun) -> rp.LoadedReport:
    """One published run's rows and metadata."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(run.path)
    except Exception as exc:  # pyarrow raises several unrelated types for damaged files
        raise rp.ReportError(f"{run.path}: unreadable parquet ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = json.loads(raw) if raw else {"run_id": run.run_id}
    return rp.LoadedReport(run.path, table.to_pandas(), meta)


def select(runs: list[FleetRun], selector: str) -> FleetRun:
    """The latest run matching ``selector``: ``key=value`` pairs joined by commas (keys:
    hardware_class, stack, date, run_id; a value may be a prefix), or a run id."""
    wanted: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in selector.split(","))):
        if "=" not in part:
            wanted["run_id"] = part
            continue
        k, v = part.split("=", 1)
        if k not in ("hardware_class", "stack", "date", "run_id"):
            raise ValueError(f"unknown selector key {k!r} in {selector!r}: use hardware_class, stack, date or run_id")
        wanted[k] = v
    matching = [r for r in runs if all(str(getattr(r, k)).startswith(v) for k, v in wanted.items())]
    if not matching:
        raise ValueError(f"no published run matches {selector!r}")
    return matching[-1]


def latest(runs: list[FleetRun], per_class: int) -> list[FleetRun]:
    """The last ``per_class`` runs of each (class, stack), and of each class overall: what the
    dashboard draws from a fleet (its trends need a window, its stacks view the latest of each)."""
    keep: dict[Path, FleetRun] = {}
    groups: dict[tuple[str, str], list[FleetRun]] = {}
    for r in runs:
        groups.setdefault((r.hardware_class, r.stack), []).append(r)
    for g in groups.values():
        for r in g[-per_class:]:
            keep[r.path] = r
    return sorted(keep.values(), key=lambda r: (r.date, r.run_id))
