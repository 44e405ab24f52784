"""Under pytest-xdist a test that times something has the machine to itself: no other worker's
test runs while it does (harness/pytest_plugin/machine.py). Shown on a real two-worker run, and
shown failing where the test does not say it times something."""

from __future__ import annotations

import fcntl
import json

import pytest

from harness.pytest_plugin.machine import MachineLock, is_timing

#: each test writes when it ran; the timing test is long enough that, unguarded, the other
#: worker's tests run beside it
SPANS = """
import json, os, time, uuid

def span(seconds):
    start = time.monotonic()
    time.sleep(seconds)
    path = os.path.join(os.environ["SPANS"], uuid.uuid4().hex + ".json")
    with open(path, "w") as fh:
        json.dump({{"test": os.environ["PYTEST_CURRENT_TEST"].split(" ")[0], "start": start, "end": time.monotonic()}}, fh)
"""

TIMED = """
import pytest
from spans import span

{mark}
def test_times_something():
    span(0.75)

{mark}
def test_times_something_next():
    span(0.75)
"""

OTHERS = """
import pytest
from spans import span

@pytest.mark.parametrize("i", range(8))
def test_other(i):
    span(0.25)
"""


#: plugins of this environment these sleeping tests never use: each of the run's three interpreters
#: would import them (hypothesis's the most), seconds of the run for nothing the lock does
UNUSED_PLUGINS = ("-p", "no:hypothesispytest", "-p", "no:anyio", "-p", "no:benchmark")


def _overlaps(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mark: str) -> list[str]:
    """Run the timed file (two tests in a row) and the others on two workers: the other tests that
    ran from the start of the first timed test to the end of the second."""
    spans = pytester.path / "spans"
    spans.mkdir()
    pytester.makepyfile(spans=SPANS.format(), test_a_timed=TIMED.format(mark=mark), test_b_others=OTHERS)
    monkeypatch.setenv("SPANS", str(spans))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider", *UNUSED_PLUGINS)
    result.assert_outcomes(passed=10)
    seen = [json.loads(p.read_text()) for p in spans.glob("*.json")]
    timed = [s for s in seen if "test_times_something" in s["test"]]
    start, end = min(s["start"] for s in timed), max(s["end"] for s in timed)
    return [s["test"] for s in seen if s not in timed and s["start"] < end and s["end"] > start]


def test_no_other_workers_test_runs_while_a_timing_test_does_nor_between_two(pytester, monkeypatch):
    assert _overlaps(pytester, monkeypatch, "@pytest.mark.amp_timing") == []


def test_a_timing_test_keeps_the_machine_for_a_timing_test_next_and_only_then(tmp_path):
    """The lock itself, two workers' handles on one directory: kept, the machine stays this
    worker's alone between the tests; not kept, the other worker may take it at once."""
    mine, other = MachineLock(tmp_path), MachineLock(tmp_path)
    try:
        for keep in (True, False):
            with mine.held(alone=True, keep=keep):
                assert not _can_share(other)
            assert mine.kept is keep
            assert _can_share(other) is not keep
        with mine.held(alone=True, keep=True):
            pass
        with mine.held(alone=False):  # an ordinary test next: the kept hold becomes a shared one
            assert _can_share(other)
        assert not mine.kept
    finally:
        mine.close()
        other.close()


def _can_share(lock: MachineLock) -> bool:
    """Whether ``lock``'s worker could start an ordinary test now (a shared hold, not waited for)."""
    try:
        fcntl.flock(lock._machine, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(lock._machine, fcntl.LOCK_UN)
    return True


def test_unmarked_the_other_workers_tests_run_beside_it(pytester, monkeypatch):
    """The negative control: without the marker the lock leaves the test to share the machine."""
    assert _overlaps(pytester, monkeypatch, "") != []


def test_the_speed_and_interconnect_fixtures_make_a_test_a_timing_test(pytester):
    pytester.makepyfile(
        test_kinds="""
import pytest

def test_plain():
    pass

@pytest.mark.amp_timing
def test_marked():
    pass

def test_speed(amp_speedup):
    pass

def test_bandwidth(amp_interconnect):
    pass
"""
    )
    items, _ = pytester.inline_genitems()
    assert {i.name: is_timing(i) for i in items} == {
        "test_plain": False,
        "test_marked": True,
        "test_speed[cpu]": True,  # amp_speedup brings amp_device, parametrized by device
        "test_bandwidth": True,
    }
