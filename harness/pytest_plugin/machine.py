"""A test that times something has the machine to itself, under pytest-xdist too.

Several xdist workers share the cores: a timing taken while another worker runs a test measures
that test as much as its own (the speed checks see other tenants and say NOISY, or worse, a
slowdown that is not the stack's). So every worker of a run takes the run's machine lock for each
test it runs: shared for an ordinary test, exclusive for a timing test (marker ``amp_timing``, or a
test that uses ``amp_speedup`` or ``amp_interconnect``). A timing test starts once the tests
running beside it have ended, and no other test starts until it has ended; the other workers
wait, idle. A worker whose next test times something too keeps the machine for it.

A second lock, the gate, is taken on the way in and let go at once: a worker waiting for the
machine alone holds the gate, so no new shared holder slips in ahead of it, and a timing test is
never starved by workers that keep starting tests. Both are ``flock`` locks on files in the run's
shared temporary directory: the kernel lets go of a dead worker's lock.

Inert where it is not needed: outside xdist, with one worker, and in a run without timing tests,
no lock is taken.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

#: the marker of a test that times something (the speed checks' fixture implies it)
TIMING_MARK = "amp_timing"
#: fixtures whose tests time something: a speedup, an interconnect's bandwidth
TIMING_FIXTURES = frozenset({"amp_speedup", "amp_interconnect"})


def is_timing(item: pytest.Item) -> bool:
    """Whether ``item`` times something: marked ``amp_timing``, or using a timing fixture."""
    if item.get_closest_marker(TIMING_MARK) is not None:
        return True
    return bool(TIMING_FIXTURES & set(getattr(item, "fixturenames", ())))


def lock_directory(config: pytest.Config) -> Path:
    """Where the workers of this run keep the machine lock: the run's temporary directory, which
    every worker's own (``<basetemp>/popen-gw<N>``) lies in; else one named for the run."""
    basetemp = getattr(config.option, "basetemp", None)
    if basetemp:
        return Path(basetemp).parent
    workerinput = getattr(config, "workerinput", {})
    return Path(tempfile.gettempdir()) / f"amp-harness-run-{workerinput.get('testrunuid', 'serial')}"


class MachineLock:
    """The run's machine lock, as one worker holds it: :meth:`held` around each test."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._gate: IO[bytes] = (directory / "amp-harness-machine.gate").open("ab")
        self._machine: IO[bytes] = (directory / "amp-harness-machine.lock").open("ab")
        #: the machine is still this worker's alone, kept for the timing test that follows
        self._kept = False

    @property
    def kept(self) -> bool:
        """Whether the machine is held alone between two tests, for the next one."""
        return self._kept

    @contextmanager
    def held(self, alone: bool, keep: bool = False) -> Iterator[None]:
        """The machine, shared with the other workers' tests or (``alone``) to this test only.

        ``keep``: a test alone keeps the machine for the next test, a timing test too. Let go
        between them, the other worker starts a test of its own in the gap, and the next timing
        test waits for all of it: two workers alternately idle through a module of timing tests.
        """
        if self._kept and not alone:
            self._release()
        if not self._kept:
            fcntl.flock(self._gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(self._machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                fcntl.flock(self._gate, fcntl.LOCK_UN)
        self._kept = False
        try:
            yield
        finally:
            if alone and keep:
                self._kept = True
            else:
                self._release()

    def _release(self) -> None:
        self._kept = False
        fcntl.flock(self._machine, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._kept:
            self._release()
        self._gate.close()
        self._machine.close()
