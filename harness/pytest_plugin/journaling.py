"""The session's journal, from the first amp-harness test to the run report.

- A process opens its journal (:class:`harness.storage.journal.Journal`) when its first amp-harness
  test starts, replays what it recorded before, and from then on appends every row, test start,
  test result and count as it happens; the fault handler writes into it (:mod:`crashes`).
- The xdist controller records a test during which a worker died as CRASHED (or HUNG, where the
  worker's last resort ended it), naming the signal from the worker's exit status and the last
  row from the worker's journal; at the end it takes in the rows and results of workers that died.
- A session that ends writes its report from memory and removes the journal. One that died leaves
  it; the next session in the same report directory (or ``amp-harness report recover``) makes the
  report from it, marked interrupted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.pytest_plugin import crashes
from harness.pytest_plugin.state import State, suite_of, suite_of_nodeid
from harness.pytest_plugin.summary import machine_metadata, static_metadata
from harness.storage import baselines as bl
from harness.storage import journal as jr

#: How a session that finds a dead session's journal recovers it (the report's ``interrupted.how``).
AT_NEXT_SESSION = "recovered from its journal by the next pytest session in the same report directory"


def recover_stale(st: State, report_dir: Path | None = None) -> list[tuple[Path, list[str]]]:
    """At a session's start (serial or the xdist controller): make the report of every dead
    session's journal in this report directory (or ``report_dir``). Returns each report with what
    it says broke."""
    where = report_dir or st.options.report_dir
    if st.is_worker or where is None:
        return []
    made, problems = jr.recover_stale(where, how=AT_NEXT_SESSION)
    st.write_errors += [(str(d), f"journal not recovered: {exc}") for d, exc in problems]
    return [(path, list(jr.describe(path))) for path in made]


def _directory(st: State) -> Path | None:
    """This run's journal directory (None in a run that writes no report)."""
    return None if st.options.report_dir is None else jr.directory_of(st.options.report_dir, st.run_id)


def _process_name(st: State) -> str:
    return st.worker_id or "main"


def open_journal(config: pytest.Config, st: State) -> None:
    """Open this process's journal (once; not in a run that writes no report) and replay into it
    what the session recorded before."""
    directory = _directory(st)
    if st.journal is not None or directory is None or st.journal_error is not None:
        return
    try:
        j = jr.Journal.open(
            directory, _process_name(st), {"run_id": st.run_id, "run_meta": static_metadata(config, st)}
        )
    except OSError as exc:
        st.journal_error = f"{directory}: {bl.describe_os_error(exc)}"
        return
    st.journal = j
    st.fault_capture = crashes.capture(j.fault_path)
    for outcome, n in st.test_outcomes.items():
        for _ in range(n):
            st._journal("count", outcome)
    for row in st.rows:
        st._journal("row", row)
    for result in st.test_results.values():
        st._journal("test", result)
    for key, data in st.attachments.items():
        st._journal("attachment", key, data)
    for key, value in machine_metadata(st).items():
        st._journal("meta", key, value)


def test_starts(item: pytest.Item, st: State, ours: bool, capability: str | None) -> None:
    """Before a test's setup: an amp-harness test opens the journal; once open, every test's start
    is recorded (the one in progress when the process dies is the one that crashed)."""
    if ours:
        open_journal(item.config, st)
    st.test_started(item.nodeid, suite_of(item), capability)


def close(st: State) -> None:
    """This process ended its session: its journal says so and lets go; the fault handler goes back."""
    if st.journal is not None:
        try:
            st.journal.close()
        except OSError as exc:
            st.journal_error = st.journal_error or f"{st.journal.directory}: {bl.describe_os_error(exc)}"
    crashes.release(st.fault_capture)
    st.fault_capture = None


# -- the xdist controller -------------------------------------------------------------------------
def node_down(st: State, node: Any, error: object | None) -> None:
    """A worker went down; if it crashed, keep its exit status for the test it was running."""
    if error is None:
        return
    wid = str(getattr(getattr(node, "gateway", None), "id", "") or "")
    st.returncodes[wid] = crashes.worker_returncode(node)


def worker_crashed(config: pytest.Config, st: State, nodeid: str, worker_id: str) -> None:
    """xdist's controller saw a worker die running ``nodeid``: its result is CRASHED or HUNG, named
    from the worker's journal (fault record, last row) and exit status. Nothing is recorded in a run
    that is not an amp-harness run (no worker journaled): the plugin stays inert there."""
    directory = _directory(st)
    if directory is None or not directory.is_dir():
        return
    _controller_journal(config, st, directory)
    records = _journal_of(directory, worker_id, nodeid)
    start: dict[str, Any] = {"nodeid": nodeid, "suite": suite_of_nodeid(nodeid, nodeid.split("::")[0])}
    fault, rows, process = "", [], worker_id
    if records is not None:
        start = next((s for s in records.starts if s["nodeid"] == nodeid), start)
        fault, rows, process = records.fault, records.rows, records.name
    end = jr.ending(fault, st.returncodes.get(worker_id))
    st.record_broken(jr.broken_result(start, end, jr.last_row_of(rows, nodeid), process=process), count=True)


def _controller_journal(config: pytest.Config, st: State, directory: Path) -> None:
    """The controller journals too once the run has a journal: its lock says the session lives
    while it writes the report, and what it saw of crashes is kept if it dies too."""
    if st.journal is None and directory.is_dir():
        open_journal(config, st)


def _journal_of(directory: Path, worker_id: str, nodeid: str) -> jr.ProcessRecords | None:
    """The journal of the worker ``worker_id`` that began ``nodeid`` last (a replaced worker keeps its id)."""
    found = None
    for path in sorted(directory.glob(f"{worker_id}-*{jr.JOURNAL}")):
        try:
            records = jr.read_process(path)
        except jr.JournalError:
            continue
        if any(s["nodeid"] == nodeid for s in records.starts):
            found = records
    return found


def take_in_dead_workers(st: State) -> None:
    """The controller's end: rows, results, counts and attachments of workers whose output never
    arrived (they died) come from their journals; a test one had begun and no one reported is
    CRASHED."""
    directory = _directory(st)
    if directory is None or not directory.is_dir():
        return
    own = st.journal.name if st.journal is not None else None
    procs = []
    for path in sorted(directory.glob(f"*{jr.JOURNAL}")):
        if path.stem in st.delivered or path.stem == own or jr.held(path):
            continue
        try:
            procs.append(jr.read_process(path))
        except jr.JournalError:
            continue
    if not procs:
        return
    st.recovered_from = [p.name for p in procs]
    rec = jr.merge(procs, directory, known=frozenset(st.test_results))
    st.rows.extend(rec.rows)
    st.attachments.update(rec.attachments)
    for k, v in rec.counts.items():  # the broken tests' failures included
        st.test_outcomes[k] = st.test_outcomes.get(k, 0) + v
    ended = {nodeid for p in procs for nodeid in p.tests}  # results the workers recorded themselves
    for nodeid, result in rec.tests.items():
        if nodeid in st.test_results:
            continue
        if nodeid in ended:
            st.test_results[nodeid] = result
        else:  # the test a worker was running when it died: merge made it CRASHED or HUNG
            st.record_broken(result, count=False)
    st.activated = True


def finished(st: State, report_written: bool) -> None:
    """The run's report is written (or the run writes none): the journal has served."""
    directory = _directory(st)
    if directory is not None and directory.is_dir() and (report_written or not (st.activated or st.rows or st.broken)):
        jr.remove(directory)
