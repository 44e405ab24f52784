"""The session's state, on ``config.stash``: options, the rows recorded, the baseline store,
test-outcome counts, and what xdist workers send back to the controller.

Fixtures never receive this object; they get narrow collaborators made from it
(:meth:`State.row_sink`, :meth:`State.profile_for`, the baseline session).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from harness.numerics.verdict import Outcome
from harness.platform.hardware import Fingerprint, detect, share_threads
from harness.pytest_plugin.machine import MachineLock
from harness.pytest_plugin.options import Options, worker_threads
from harness.storage import baselines as bl
from harness.storage import report as rp
from harness.storage.journal import Journal
from harness.storage.provenance import git_commit

_WORKER_KEY = "amp_harness"


def gpu_for_worker(worker_id: str | None, gpus: int) -> int:
    """Under pytest-xdist each worker (gw0, gw1, ...) gets its own GPU, round robin."""
    if not worker_id or gpus <= 0:
        return 0
    digits = "".join(ch for ch in worker_id if ch.isdigit())
    return int(digits or 0) % gpus


def selected_devices(devices: str, worker_id: str | None = None) -> list[str]:
    """The devices the device-parametrized checks run on, for ``--amp-device`` and this worker."""
    if devices == "auto" or devices == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ["cpu"]
        gpu = f"cuda:{gpu_for_worker(worker_id, torch.cuda.device_count())}"
        return ["cpu", gpu] if devices == "auto" else [gpu]
    return [devices]


@dataclass
class State:
    """Per-session plugin state (on ``config.stash``)."""

    options: Options
    rootdir: Path
    run_id: str
    started: str
    store: bl.BaselineStore
    worker_id: str | None = None
    is_worker: bool = False
    #: an amp-harness fixture was used (a run that used none writes no report)
    activated: bool = False
    rows: list[dict[str, Any]] = field(default_factory=list)
    deselected: int = 0
    test_outcomes: dict[str, int] = field(default_factory=dict)
    #: each test's own result, by node id (:meth:`record_test`): stored beside its rows
    test_results: dict[str, dict[str, Any]] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    #: (path, reason) of baseline or report writes the session's end could not make
    write_errors: list[tuple[str, str]] = field(default_factory=list)
    report_path: Path | None = None
    #: files written into the run report beside its rows (a failed check's saved inputs), by name
    attachments: dict[str, bytes] = field(default_factory=dict)
    #: this process's journal (:mod:`harness.pytest_plugin.journaling`): every row and test result
    #: appended as recorded, so that a crash loses nothing; None before the first amp-harness test
    #: and in a run that writes no report
    journal: Journal | None = None
    #: why the journal could not be written (a full disk): said at the end; the run went on and its
    #: report is made from memory as before
    journal_error: str | None = None
    #: tests this process saw break (crashed or hung), by node id, as their results
    broken: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the run's journals a report was made from, beside this process's own (xdist workers' that died)
    recovered_from: list[str] = field(default_factory=list)
    #: (controller) the journals of workers whose output arrived: their records are in memory
    delivered: set[str] = field(default_factory=set)
    #: (controller) exit status of each worker that went down with an error, by worker id
    returncodes: dict[str, int | None] = field(default_factory=dict)
    #: the fault handler pointed at this process's journal (:mod:`harness.pytest_plugin.crashes`)
    fault_capture: Any = None
    #: reports this session made from dead sessions' journals at its start, with what broke there
    recovered_runs: list[tuple[Path, list[str]]] = field(default_factory=list)
    #: ``--amp-resume``: where the earlier parts are, how many tests they finished, how many are left
    resumed: dict[str, Any] | None = None

    #: xdist workers in the run (0: not under xdist)
    worker_count: int = 0
    #: (xdist worker, in a run with timing tests) the run's machine lock: each test holds it
    #: shared, a timing test alone (:mod:`harness.pytest_plugin.machine`)
    machine: MachineLock | None = None
    #: what :meth:`share_cores` set, in words (None: not yet, or nothing to set)
    threads_note: str | None = None
    #: (controller) each worker's id, torch threads and CPU hardware class
    workers: list[dict[str, Any]] = field(default_factory=list)

    def share_cores(self) -> None:
        """In an xdist worker, give torch its share of the cores (``--amp-worker-threads``), once,
        before the first amp-harness test and before the hardware class is detected (the class
        records the thread count the checks ran on). Outside amp-harness tests nothing changes."""
        if not self.is_worker or self.threads_note is not None:
            return
        import os

        import torch

        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        n, why = worker_threads(self.options.worker_threads, self.worker_count, cpus, os.environ.get("OMP_NUM_THREADS"))
        if n is not None:
            share_threads(n)  # the hardware class still names the machine (machine_threads)
            with contextlib.suppress(RuntimeError):  # the inter-op pool already started: it stays
                torch.set_num_interop_threads(n)
        self.threads_note = f"{torch.get_num_threads()} torch threads ({why})"

    @cached_property
    def fingerprint(self) -> Fingerprint:
        """Detected once, when first needed (it imports torch), after the worker's core share. Its
        hardware class names the machine, not the worker's share of the cores (that is
        :attr:`threads_note`, in the report's ``xdist_workers``): :func:`machine_threads`."""
        self.share_cores()
        return detect()

    @cached_property
    def commit(self) -> str | None:
        return git_commit(self.rootdir)

    def profile_for(self, device: str) -> str:
        """The hardware profile of a device; ``--amp-profile`` overrides the run's primary device."""
        fp = self.fingerprint
        is_cuda = device.startswith("cuda")
        detected = (fp.cuda_profile or "generic") if is_cuda else fp.cpu_profile
        primary_is_cuda = bool(fp.gpus) and self.options.devices != "cpu"
        if self.options.profile and is_cuda == primary_is_cuda:
            return self.options.profile
        return detected

    @property
    def primary_device(self) -> str:
        d = self.options.devices
        if d in ("auto", "cuda") and self.fingerprint.gpus:
            return f"cuda:{gpu_for_worker(self.worker_id, len(self.fingerprint.gpus))}"
        return "cpu" if d == "auto" else d

    def add_row(self, row: rp.Row) -> None:
        """The row sink handed to recorders: kept, and journaled at once."""
        self.activated = True
        d = row.as_dict()
        self.rows.append(d)
        self._journal("row", d)

    def _journal(self, method: str, *args: Any) -> None:
        """Append to the journal; a journal that cannot be written (a full disk) is said once, and
        the run goes on with its report made from memory as before."""
        if self.journal is None or self.journal.closed:
            return
        try:
            getattr(self.journal, method)(*args)
        except OSError as exc:
            self.journal_error = self.journal_error or f"{self.journal.directory}: {bl.describe_os_error(exc)}"

    def attach(self, name: str, data: bytes) -> str:
        """Queue a file for the run report (written with it, atomically); returns its name there,
        made unique and safe (``attachments/<n>-<name>``)."""
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:80]
        key = f"{rp.ATTACHMENTS}/{self.worker_id or 'gw'}-{len(self.attachments)}-{safe}"
        self.attachments[key] = data
        self._journal("attachment", key, data)
        return key

    def count_test(self, outcome: str) -> None:
        self.test_outcomes[outcome] = self.test_outcomes.get(outcome, 0) + 1
        self._journal("count", outcome)

    def test_started(self, nodeid: str, suite: str, capability: str | None) -> None:
        self._journal("started", nodeid, suite, capability)

    def test_ended(self, nodeid: str) -> None:
        """A test's phases all ran: its result goes to the journal."""
        if nodeid in self.test_results:
            self._journal("test", self.test_results[nodeid])

    def record_broken(self, result: dict[str, Any], *, count: bool) -> None:
        """A test that crashed or hung, as its result (:func:`harness.storage.journal.broken_result`);
        ``count``: add it to pytest's counts as a failure (a test pytest itself never reported)."""
        self.broken[str(result["nodeid"])] = result
        self.test_results[str(result["nodeid"])] = dict(result)
        if count:
            self.count_test("failed")
        self._journal("test", result)

    def record_test(
        self,
        nodeid: str,
        suite: str,
        phase: str,
        outcome: str,
        duration: float,
        message: str,
        detail: str = "",
        capability: str | None = None,
    ) -> None:
        """One phase of a test: the result is the first phase that did not pass (setup error or
        skip, the call's outcome, a teardown error), the duration their sum."""
        r = self.test_results.setdefault(
            nodeid,
            {
                "nodeid": nodeid,
                "suite": suite,
                "result": "passed",
                "duration_s": 0.0,
                "message": "",
                "detail": "",
                "capability": capability,
            },
        )
        r["duration_s"] += duration
        if r["result"] == Outcome.HUNG.value:
            return  # the time limit stopped it: what its teardown said after does not change that
        if phase == "call" or (outcome != "passed" and r["result"] in ("passed", "xpassed")):
            if phase != "call" and outcome == "failed":
                outcome = "error"
            r["result"], r["message"] = outcome, message or r["message"]
            r["detail"] = detail or r["detail"]

    def test_table(self) -> list[dict[str, Any]]:
        """Every test's result with its verdict: :meth:`Outcome.of_test` of the result and the
        outcomes of the rows it recorded (one vocabulary with rows, diff, dashboard, qualify)."""
        by_test: dict[str, list[str]] = {}
        for row in self.rows:
            by_test.setdefault(str(row["nodeid"]), []).append(str(row["outcome"]))
        return [
            {**r, "verdict": Outcome.of_test(r["result"], by_test.get(r["nodeid"], ())).value}
            for r in self.test_results.values()
        ]

    # -- xdist --------------------------------------------------------------------------------
    def worker_output(self) -> dict[str, Any]:
        """What a worker sends to the controller at the end of its session."""
        return {
            "rows": self.rows,
            "activated": self.activated,
            "written": self.written,
            "write_errors": self.write_errors,
            "used": sorted(str(p) for p in self.store.used),
            "outcomes": self.test_outcomes,
            "test_results": self.test_results,
            "attachments": self.attachments,
            "journal": self.journal.name if self.journal is not None else None,
            "resumed": self.resumed,
            "journal_error": self.journal_error,
            "worker": {
                "id": self.worker_id,
                "threads": self.threads_note,
                "hardware_class": self.fingerprint.cpu_class.id if "fingerprint" in self.__dict__ else None,
            },
        }

    def merge_worker(self, out: dict[str, Any]) -> None:
        """The controller takes in one worker's rows, writes, used baselines and test counts."""
        self.rows.extend(out["rows"])
        self.activated |= bool(out["activated"])
        self.written.extend(out["written"])
        self.write_errors.extend((str(p), str(why)) for p, why in out.get("write_errors", []))
        self.store.used.update(Path(p) for p in out["used"])
        for k, v in out["outcomes"].items():
            self.test_outcomes[k] = self.test_outcomes.get(k, 0) + v
        self.test_results.update(out.get("test_results", {}))
        self.attachments.update(out.get("attachments", {}))
        if out.get("journal"):
            self.delivered.add(str(out["journal"]))
        self.journal_error = self.journal_error or out.get("journal_error")
        self.resumed = self.resumed or out.get("resumed")  # every worker collects (and resumes) alike
        if out.get("worker"):
            self.workers.append(dict(out["worker"]))


STATE = pytest.StashKey[State]()
WORKER_KEY = _WORKER_KEY


def state_of(config: pytest.Config) -> State:
    return config.stash[STATE]


def suite_of(item: pytest.Item) -> str:
    """Suite name: the ``amp_suite`` marker, else the directory under ``suites/``, else the module name."""
    marker = item.get_closest_marker("amp_suite")
    if marker is not None and marker.args:
        return str(marker.args[0])
    return _suite_of_path(str(item.path))


def suite_of_nodeid(nodeid: str, path: str) -> str:
    """The suite of a test known by its node id and path only (a crashed worker's test, seen by the
    controller, which has no item): the directory under ``suites/``, else the module name."""
    return _suite_of_path(path or nodeid.split("::")[0])


def _suite_of_path(path: str) -> str:
    parts = Path(path).parts
    if "suites" in parts:
        i = len(parts) - 1 - parts[::-1].index("suites")
        if i + 2 < len(parts):
            return parts[i + 1]
    return Path(path).stem.removeprefix("test_")
