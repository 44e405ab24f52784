"""A fleet's run reports as one partitioned parquet dataset.

Every machine that qualifies a stack publishes its run (``amp-harness publish RUN --fleet DIR``)
into a shared directory laid out as hive partitions::

    DIR/hardware_class=<class>/stack=torch-<minor>/date=<YYYY-MM-DD>/<run_id>.parquet

One file per run holds the run's rows; the run's metadata (run.json) rides in the file's parquet
metadata. Readers never load the whole fleet: the partition directories and file names say which
class, stack, day and run each file is (run ids start with their UTC start time, so they sort by
time), and only the files a view needs are opened. ``pyarrow.dataset`` reads the same layout
(``partitioning="hive"``) for ad-hoc queries over all of it.

The dataset may also live in object storage: ``DIR`` may be a URL pyarrow's filesystems open
(``s3://bucket/prefix``, ``gs://bucket/prefix``, ``file:///path``), with an S3-compatible endpoint
as the URL's query (``?endpoint_override=host:port&scheme=http``) and credentials from the standard
environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile, an instance role; Google's
application default credentials), never from this harness's files: a URL is shown with any
credentials it carries removed (:func:`shown`).

Writes are atomic, so a reader never sees a half-written run: locally a temporary file in the
partition renamed into place; in object storage one object written whole (an S3 or GCS object
appears only when its upload completes: an interrupted upload leaves no object). Two machines
publishing at once do not collide: run ids are unique, and each run is one object of its own.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePath, PurePosixPath
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from harness.domains.versions import minor
from harness.storage import report as rp

META_KEY = b"amp_harness_run"
_SAFE = re.compile(r"[^A-Za-z0-9_.+\-]+")


def _part(value: object) -> str:
    return _SAFE.sub("_", str(value)).strip("_") or "unknown"


#: Query keys of a location URL whose values are never shown (credentials, tokens)
_SECRET_KEYS = re.compile(r"secret|password|token|key|credential|session", re.IGNORECASE)


def shown(location: str | os.PathLike[str]) -> str:
    """A location as messages, reports and dashboards may show it: a URL's user and password and
    every query value that names a credential removed (``s3://bucket/p?secret_key=...`` ->
    ``s3://bucket/p?secret_key=***``)."""
    text = os.fspath(location)
    if "://" not in text:
        return text
    parts = urlsplit(text)
    netloc = parts.hostname or ""
    if parts.port is not None:
        netloc = f"{netloc}:{parts.port}"
    query = urlencode(
        [(k, "***" if _SECRET_KEYS.search(k) else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)],
        safe=":/*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


@dataclass(frozen=True)
class Location:
    """Where a fleet dataset lives: a local directory (``filesystem`` None: plain files and
    renames), or a path inside a pyarrow filesystem opened from a URL."""

    base: str
    filesystem: Any = None
    #: the location as it may be shown (:func:`shown`)
    label: str = ""

    @property
    def local(self) -> bool:
        return self.filesystem is None


class FleetLocationError(ValueError):
    """A fleet location that cannot be opened: what it is, and what a location may be."""


def locate(root: str | os.PathLike[str]) -> Location:
    """The :class:`Location` of ``root``: a directory, or a URL (``s3://``, ``gs://``, ``file://``)."""
    text = os.fspath(root)
    if "://" not in text:
        return Location(text, None, text)
    import pyarrow.fs as pf

    try:
        fs, base = pf.FileSystem.from_uri(text)
    except Exception as exc:  # pyarrow raises ArrowInvalid, ValueError or OSError for a bad URL
        raise FleetLocationError(
            f"{shown(text)}: not a fleet location ({type(exc).__name__}: {shown(str(exc))}); give a directory or a "
            "URL pyarrow opens: s3://bucket/prefix (an S3-compatible endpoint as ?endpoint_override=host:port"
            "&scheme=http), gs://bucket/prefix or file:///path"
        ) from None
    if isinstance(fs, pf.LocalFileSystem):
        return Location(base, None, base)
    return Location(base.rstrip("/"), fs, shown(text))


@dataclass(frozen=True)
class FleetRun:
    """One published run, as its path names it (nothing read from the file)."""

    hardware_class: str
    stack: str
    date: str
    run_id: str
    #: the file: a local path, or its path inside ``location``'s filesystem
    path: PurePath
    location: Location = field(default=Location(""), compare=False, repr=False)

    @property
    def where(self) -> str:
        """The file as messages show it (a URL without credentials for object storage)."""
        if self.location.local:
            return str(self.path)
        rel = PurePosixPath(self.path).relative_to(self.location.base)
        return f"{self.location.label.split('?', 1)[0].rstrip('/')}/{rel}"


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


def publish(run: rp.LoadedReport, root: str | os.PathLike[str]) -> str:
    """Write one run into the fleet dataset at ``root`` (a directory or a URL); returns the file
    written, as it may be shown."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    loc = locate(root)

    meta = dict(run.meta)
    run_id = str(meta.get("run_id") or run.path.name)
    started = str(meta.get("started") or "")
    date = started[:10] if re.match(r"\d{4}-\d{2}-\d{2}", started) else run_id[:8]
    if re.match(r"\d{8}$", date):
        date = f"{date[:4]}-{date[4:6]}-{date[6:]}"
    relative = (
        PurePosixPath(
            f"hardware_class={_part(class_of(meta))}", f"stack={_part(stack_of(meta))}", f"date={_part(date)}"
        )
        / f"{_part(run_id)}.parquet"
    )
    table = pa.Table.from_pandas(run.rows, preserve_index=False)
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), META_KEY: json.dumps(meta, default=str).encode()}
    )
    if not loc.local:  # one object, visible only once its upload completes
        key = f"{loc.base}/{relative}"
        pq.write_table(table, key, filesystem=loc.filesystem)
        return FleetRun("", "", "", "", PurePosixPath(key), loc).where
    final = Path(loc.base) / relative
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{os.getpid()}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, final)
    return str(final)


def index(root: str | os.PathLike[str]) -> list[FleetRun]:
    """Every published run, from directory and file names only, oldest first."""
    loc = locate(root)
    if not loc.local:
        return _index_remote(loc)
    out: list[FleetRun] = []
    base = Path(loc.base)
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


def _index_remote(loc: Location) -> list[FleetRun]:
    """:func:`index` in object storage: one listing of the prefix, the layout read from the keys."""
    import pyarrow.fs as pf

    infos = loc.filesystem.get_file_info(pf.FileSelector(loc.base, recursive=True, allow_not_found=True))
    out = []
    for info in infos:
        if info.type != pf.FileType.File:
            continue
        rel = PurePosixPath(info.path).relative_to(loc.base).parts
        if (
            len(rel) != 4
            or not rel[3].endswith(".parquet")
            or rel[3].startswith(".")
            or not all(p.startswith(k) for p, k in zip(rel, ("hardware_class=", "stack=", "date="), strict=False))
        ):
            continue
        cls, stack, date = (p.split("=", 1)[1] for p in rel[:3])
        out.append(FleetRun(cls, stack, date, rel[3].removesuffix(".parquet"), PurePosixPath(info.path), loc))
    if not out:
        raise FileNotFoundError(
            f"{loc.label}: no fleet dataset here (publish a run with `amp-harness publish RUN --fleet {loc.label}`)"
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
        table = pq.read_table(str(run.path), filesystem=run.location.filesystem)
    except Exception as exc:  # pyarrow raises several unrelated types for damaged files
        raise rp.ReportError(f"{run.where}: unreadable parquet ({shown(str(exc))})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = json.loads(raw) if raw else {"run_id": run.run_id}
    return rp.LoadedReport(Path(run.path), rp.with_origin(table.to_pandas(), meta), meta)


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
    keep: dict[PurePath, FleetRun] = {}
    groups: dict[tuple[str, str], list[FleetRun]] = {}
    for r in runs:
        groups.setdefault((r.hardware_class, r.stack), []).append(r)
    for g in groups.values():
        for r in g[-per_class:]:
            keep[r.path] = r
    return sorted(keep.values(), key=lambda r: (r.date, r.run_id))
