"""The run journal: every row and test result appended as it is recorded, so that a run whose
process dies (a segfault in a kernel, an abort, the OOM killer, a power cut) still leaves its
report.

Layout, beside the run reports (``<report-dir>/.journal-<run_id>/``, hidden from readers of
reports)::

    <process>-<pid>.jsonl     one JSON record a line, appended and flushed by that process
    <process>-<pid>.fault     what the process's fault handler wrote: a fatal signal's traceback,
                              or the stacks a time limit dumped before ending the process
    attachments/              files a failed check saved for its reproduction

Each process (the serial session, an xdist worker, the xdist controller) holds an exclusive
``flock`` on its own ``.jsonl`` for as long as it lives; the kernel drops it when the process
ends, however it ends. A journal whose files nobody holds belongs to a dead session: its report
is made from the records (:func:`recover`), marked interrupted, and the journal removed.

Each record is flushed and fsynced as it is written: a crash or a ``SIGKILL`` loses nothing, a
power cut at most the record being written. A torn last line is skipped when read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.numerics.verdict import Outcome
from harness.storage import atomic
from harness.storage import report as rp

#: The journal of run ``<run_id>`` is ``<report-dir>/<PREFIX><run_id>``: a dot directory, which
#: readers of a report directory (:func:`harness.storage.report.find_runs`) pass over.
PREFIX = ".journal-"
JOURNAL = ".jsonl"
FAULT = ".fault"


def directory_of(report_dir: Path, run_id: str) -> Path:
    """The journal directory of run ``run_id`` in ``report_dir``."""
    return report_dir / f"{PREFIX}{run_id}"


class JournalError(Exception):
    """A journal that cannot be read or recovered; names the path."""


class Journal:
    """One process's journal: append-only, each record flushed and fsynced as written.

    Usage::

        j = Journal.open(directory_of(report_dir, run_id), "main", {"started": ...})
        j.started("tests/test_x.py::test_a", suite="x", capability=None)
        j.row(row.as_dict())
        j.test({"nodeid": ..., "result": "passed", ...})
        j.close()   # a clean end: the session's report is written from memory, the journal removed
    """

    def __init__(self, directory: Path, name: str, fh: IO[str]) -> None:
        self.directory = directory
        self.name = name
        self._fh = fh
        self.closed = False

    @classmethod
    def open(cls, directory: Path, process: str, header: Mapping[str, Any]) -> Journal:
        """Create this process's journal in ``directory`` (made if missing), lock it and write its
        header: who wrote it (``process``, pid, host) and the run's metadata known at its start."""
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{process}-{os.getpid()}"
        fh = (directory / f"{name}{JOURNAL}").open("a", encoding="utf-8")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise
        j = cls(directory, name, fh)
        j._append({"t": "header", "process": process, "pid": os.getpid(), "host": socket.gethostname(), **header})
        return j

    @property
    def fault_path(self) -> Path:
        """Where this process's fault handler writes (a fatal signal's traceback, a time limit's stacks)."""
        return self.directory / f"{self.name}{FAULT}"

    def _append(self, record: dict[str, Any]) -> None:
        if self.closed:
            return
        self._fh.write(json.dumps({**record, "at": rp.now_iso()}, default=str) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def meta(self, key: str, value: Any) -> None:
        """Run metadata learnt after the header (the machine's fingerprint, detected when first needed)."""
        self._append({"t": "meta", "key": key, "value": value})

    def row(self, row: Mapping[str, Any]) -> None:
        self._append({"t": "row", "row": dict(row)})

    def started(self, nodeid: str, suite: str, capability: str | None) -> None:
        """A test begins: if the process dies before its result, the test is the one that crashed."""
        self._append({"t": "start", "nodeid": nodeid, "suite": suite, "capability": capability})

    def test(self, result: Mapping[str, Any]) -> None:
        """A test's own result, once all its phases ran."""
        self._append({"t": "test", "result": dict(result)})

    def count(self, outcome: str) -> None:
        """One of pytest's test counts (the run metadata's ``tests``)."""
        self._append({"t": "count", "outcome": outcome})

    def attachment(self, key: str, data: bytes) -> None:
        """A file for the run report (``attachments/<name>``), kept beside the journal."""
        path = self.directory / key
        if path.resolve().parent != (self.directory / rp.ATTACHMENTS).resolve():
            raise ValueError(f"attachment {key!r} must lie in {rp.ATTACHMENTS}/")
        atomic.write_bytes(path, data)
        self._append({"t": "attachment", "key": key})

    def close(self) -> None:
        """A clean end: the record that says this process finished, then the lock goes."""
        if self.closed:
            return
        self._append({"t": "closed"})
        self.closed = True
        self._fh.close()


# -- reading ----------------------------------------------------------------------------------------
@dataclass
class ProcessRecords:
    """What one process's journal holds."""

    name: str
    header: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    #: node id -> result, in the order they ended
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    #: the tests begun, in order, with their start records
    starts: list[dict[str, Any]] = field(default_factory=list)
    attachments: list[str] = field(default_factory=list)
    closed: bool = False
    last_at: str = ""
    #: what the process's fault handler wrote ("" when nothing)
    fault: str = ""
    #: lines that could not be read (a torn last line after a power cut)
    torn: int = 0

    @property
    def in_progress(self) -> dict[str, Any] | None:
        """The test begun and never ended (the one during which the process died), or None."""
        if not self.starts or self.starts[-1]["nodeid"] in self.tests:
            return None
        return dict(self.starts[-1])


def held(path: Path) -> bool:
    """Whether a live process holds ``path``'s lock (its journal is being written)."""
    try:
        with path.open("a", encoding="utf-8") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def read_process(path: Path) -> ProcessRecords:
    """One process's journal; a line that does not parse (torn by a power cut) is counted and skipped."""
    header: dict[str, Any] = {}
    out = ProcessRecords(path.stem, header)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise JournalError(f"{path}: unreadable journal ({exc})") from None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            out.torn += 1
            continue
        if not isinstance(rec, dict):
            out.torn += 1
            continue
        kind = rec.get("t")
        out.last_at = str(rec.get("at") or out.last_at)
        if kind == "header":
            header.update({k: v for k, v in rec.items() if k not in ("t", "at")})
            header["at"] = rec.get("at")
        elif kind == "meta":
            out.meta[str(rec["key"])] = rec.get("value")
        elif kind == "row":
            out.rows.append(rec["row"])
        elif kind == "start":
            out.starts.append(rec)
        elif kind == "test":
            out.tests[str(rec["result"]["nodeid"])] = rec["result"]
        elif kind == "count":
            out.counts[str(rec["outcome"])] = out.counts.get(str(rec["outcome"]), 0) + 1
        elif kind == "attachment":
            out.attachments.append(str(rec["key"]))
        elif kind == "closed":
            out.closed = True
    fault = path.with_suffix(FAULT)
    if fault.is_file():
        out.fault = fault.read_text(encoding="utf-8", errors="replace")
    return out


def read(directory: Path) -> list[ProcessRecords]:
    """Every process's journal in ``directory``, in the order they began."""
    procs = [read_process(p) for p in sorted(directory.glob(f"*{JOURNAL}"))]
    return sorted(procs, key=lambda p: str(p.header.get("at") or ""))


def live(directory: Path) -> bool:
    """Whether any process still writes this journal."""
    return any(held(p) for p in directory.glob(f"*{JOURNAL}"))


def stale(report_dir: Path) -> list[Path]:
    """The journals in ``report_dir`` that no live process writes: runs that died, to recover."""
    if not report_dir.is_dir():
        return []
    return sorted(d for d in report_dir.glob(f"{PREFIX}*") if d.is_dir() and not live(d))


# -- how a process ended ----------------------------------------------------------------------------
#: What Python's fault handler prints for each fatal signal it catches ("Fatal Python error: <name>").
_FAULT_NAMES = {
    "Segmentation fault": signal.SIGSEGV,
    "Aborted": signal.SIGABRT,
    "Bus error": signal.SIGBUS,
    "Floating-point exception": signal.SIGFPE,
    "Floating point exception": signal.SIGFPE,
    "Illegal instruction": signal.SIGILL,
}
_FATAL = re.compile(r"Fatal Python error: ([A-Za-z -]+)")
#: faulthandler.dump_traceback_later's first line: the hard time limit ended the process
_TIMEOUT = re.compile(r"^Timeout \((\d+:\d\d:\d\d(?:\.\d+)?)\)!", re.MULTILINE)


@dataclass(frozen=True)
class Ending:
    """How a process ended during a test: ``outcome`` CRASHED or HUNG, ``cause`` in words
    (``SIGSEGV (Segmentation fault)``, ``exit status 3``), and the fault handler's stacks."""

    outcome: Outcome
    cause: str
    stacks: str = ""


def signal_name(signum: int) -> str:
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    return f"{sig.name} ({signal.strsignal(sig) or sig.name})"


def ending(fault: str, returncode: int | None = None) -> Ending:
    """How a process ended, from what its fault handler wrote and, where another process saw it
    end (xdist's controller, ``amp-harness qualify``), its exit status (negative: the signal)."""
    if _TIMEOUT.search(fault):
        return Ending(Outcome.HUNG, "the hard time limit ended the process", fault.strip())
    fatal = _FATAL.search(fault)
    if returncode is not None and returncode < 0:
        return Ending(Outcome.CRASHED, signal_name(-returncode), fault.strip())
    if fatal is not None:
        sig = _FAULT_NAMES.get(fatal.group(1).strip())
        cause = signal_name(sig) if sig is not None else fatal.group(1).strip()
        return Ending(Outcome.CRASHED, cause, fault.strip())
    if returncode is not None and returncode > 128 and returncode - 128 < signal.NSIG:
        return Ending(Outcome.CRASHED, signal_name(returncode - 128) + f" (exit status {returncode})", fault.strip())
    if returncode is not None:
        return Ending(Outcome.CRASHED, f"exit status {returncode}", fault.strip())
    return Ending(
        Outcome.CRASHED,
        "killed without a trace: no fatal signal was caught (SIGKILL, the OOM killer, a power cut); "
        "run with --amp-isolate to have the exit status",
        fault.strip(),
    )


def broken_result(
    start: Mapping[str, Any], end: Ending, last_row: Mapping[str, Any] | None, *, process: str, duration_s: float = 0.0
) -> dict[str, Any]:
    """The test result of a test whose process died or hung during it (:data:`harness.storage.report.TEST_COLUMNS`)."""
    if last_row is not None:
        last = f"last row recorded: {last_row.get('suite')}/{last_row.get('check') or '-'} {last_row.get('metric')}"
    else:
        last = "it recorded no row"
    verb = "hung" if end.outcome is Outcome.HUNG else "crashed"
    return {
        "nodeid": start["nodeid"],
        "suite": start.get("suite", ""),
        "capability": start.get("capability"),
        "result": end.outcome.value,
        "duration_s": duration_s,
        "message": f"{verb}: {end.cause}, in process {process}; {last}",
        "detail": end.stacks,
    }


def last_row_of(rows: list[dict[str, Any]], nodeid: str) -> dict[str, Any] | None:
    return next((r for r in reversed(rows) if r.get("nodeid") == nodeid), None)


# -- recovery ---------------------------------------------------------------------------------------
@dataclass
class Recovered:
    """What the journals of a run hold, merged: rows, test results, counts, attachments, and the
    tests that broke (crashed or hung), for the run report."""

    run_id: str
    rows: list[dict[str, Any]]
    tests: dict[str, dict[str, Any]]
    counts: dict[str, int]
    attachments: dict[str, bytes]
    header: dict[str, Any]
    meta: dict[str, Any]
    broken: list[dict[str, Any]]
    processes: list[dict[str, Any]]
    last_at: str


def merge(
    procs: list[ProcessRecords],
    directory: Path,
    *,
    returncodes: Mapping[str, int | None] | None = None,
    known: frozenset[str] = frozenset(),
) -> Recovered:
    """The records of ``procs`` as one run. A process that did not close died: the test it had
    begun gets a CRASHED or HUNG result (:func:`ending` of its fault file and, where known, its
    exit status: ``returncodes`` by process name), counted failed; a test with a result already
    keeps it, in the records or in ``known`` (results the caller has from elsewhere)."""
    rows: list[dict[str, Any]] = []
    tests: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    attachments: dict[str, bytes] = {}
    header: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    processes: list[dict[str, Any]] = []
    for p in procs:
        header = header or dict(p.header)
        meta.update(p.meta)
        rows.extend(p.rows)
        tests.update(p.tests)
        for k, v in p.counts.items():
            counts[k] = counts.get(k, 0) + v
        for key in p.attachments:
            with contextlib.suppress(OSError):
                attachments[key] = (directory / key).read_bytes()
        processes.append(
            {"name": p.name, "closed": p.closed, "last_record": p.last_at, "torn_lines": p.torn, "fault": bool(p.fault)}
        )
        start = p.in_progress if not p.closed else None
        if start is not None and start["nodeid"] not in tests and start["nodeid"] not in known:
            code = (returncodes or {}).get(p.name)
            result = broken_result(start, ending(p.fault, code), last_row_of(p.rows, start["nodeid"]), process=p.name)
            tests[result["nodeid"]] = result
            counts["failed"] = counts.get("failed", 0) + 1
    broken = [t for t in tests.values() if t.get("result") in (Outcome.HUNG.value, Outcome.CRASHED.value)]
    return Recovered(
        run_id=str(header.get("run_id") or directory.name.removeprefix(PREFIX)),
        rows=rows,
        tests=tests,
        counts=counts,
        attachments=attachments,
        header=header,
        meta=meta,
        broken=broken,
        processes=processes,
        last_at=max((p.last_at for p in procs), default=""),
    )


def recovered_metadata(rec: Recovered, how: str, exit_status: int | None = None) -> dict[str, Any]:
    """``run.json`` of a run recovered from its journal: what its header and meta records said,
    its counts and test results from the records, and ``interrupted`` saying what happened."""
    static = dict(rec.header.get("run_meta") or {})
    return {
        **static,
        **rec.meta,
        "finished": rec.last_at,
        "tests": dict(rec.counts),
        "test_results": [dict(t, verdict=_verdict(t, rec.rows).value) for t in rec.tests.values()],
        "exitstatus": exit_status,
        "row_outcomes": rp.summarize(rec.rows),
        "write_errors": [],
        "interrupted": {
            "recovered_at": rp.now_iso(),
            "how": how,
            "processes": rec.processes,
            "broken": [{"nodeid": b["nodeid"], "result": b["result"], "message": b["message"]} for b in rec.broken],
        },
    }


def _verdict(test: Mapping[str, Any], rows: list[dict[str, Any]]) -> Outcome:
    labels = [str(r["outcome"]) for r in rows if r.get("nodeid") == test["nodeid"]]
    return Outcome.of_test(str(test["result"]), labels)


def recover(directory: Path, *, how: str, exit_status: int | None = None, returncode: int | None = None) -> Path:
    """Write the run report of a dead session from its journal ``directory``, marked interrupted,
    then remove the journal; the report's path. ``returncode``: the session's exit status where
    the caller saw it end (``amp-harness qualify``), which names the signal of a process that left
    no fault record. A journal a live process still writes is refused; a run whose report was
    written before the process died keeps that report (the journal is only removed)."""
    if live(directory):
        raise JournalError(f"{directory}: a running session still writes this journal; recover it once it ended")
    procs = read(directory)
    if not procs:
        shutil.rmtree(directory, ignore_errors=True)
        raise JournalError(f"{directory}: an empty journal (the session died before recording anything); removed")
    codes = {p.name: returncode for p in procs if not p.closed} if returncode is not None else None
    rec = merge(procs, directory, returncodes=codes)
    final = directory.parent / rec.run_id
    if not (final / rp.ROWS_PARQUET).is_file():
        meta = recovered_metadata(rec, how, exit_status)
        rp.write(directory.parent, rec.run_id, rec.rows, meta, rec.attachments)
    shutil.rmtree(directory, ignore_errors=True)
    return final


def recover_stale(
    report_dir: Path, *, how: str, exit_status: int | None = None, returncode: int | None = None
) -> tuple[list[Path], list[tuple[Path, Exception]]]:
    """:func:`recover` every journal of ``report_dir`` that no live process writes: the reports
    made, and each journal that could not be recovered with why."""
    made: list[Path] = []
    problems: list[tuple[Path, Exception]] = []
    for directory in stale(report_dir):
        try:
            made.append(recover(directory, how=how, exit_status=exit_status, returncode=returncode))
        except (JournalError, OSError, ValueError) as exc:
            problems.append((directory, exc))
    return made, problems


def remove(directory: Path) -> None:
    """A journal whose run's report was written: no longer needed."""
    shutil.rmtree(directory, ignore_errors=True)


def describe(report: Path) -> Iterator[str]:
    """Lines that say what a recovered run's report holds: its broken tests."""
    try:
        meta = json.loads((report / rp.RUN_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    info = meta.get("interrupted") or {}
    for b in info.get("broken") or []:
        yield f"  {str(b['result']).upper()} {b['nodeid']}: {b['message']}"


# -- resuming a qualification cut short ---------------------------------------------------------------
def finished_tests(report_dir: Path) -> dict[str, str]:
    """node id -> run id of every test with a result in the run reports of ``report_dir`` (one
    qualification in parts): what a resumed run need not run again. A test that was running when
    its session was cut (CRASHED in an interrupted run's ``broken`` list: the cut, not the test,
    may have ended it) is not finished, unless it was cut short in two runs: then it is the test
    that ends its process, and running it again would only end the next part too."""
    done: dict[str, str] = {}
    cut: dict[str, int] = {}
    for run in rp.find_runs(report_dir) if report_dir.is_dir() else []:
        try:
            meta = json.loads((run / rp.RUN_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        broken = {str(b.get("nodeid")) for b in (meta.get("interrupted") or {}).get("broken") or []}
        for nodeid in broken:
            cut[nodeid] = cut.get(nodeid, 0) + 1
        for t in meta.get("test_results") or []:
            nodeid = str(t.get("nodeid"))
            if nodeid not in broken or cut[nodeid] > 1:
                done[nodeid] = str(meta.get("run_id") or run.name)
    return done
