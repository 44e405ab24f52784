"""Under pytest-xdist a test that times something has the machine to itself: no other worker's
test runs while it does (harness/pytest_plugin/machine.py). Shown on a real two-worker run, and
shown failing where the test does not say it times something."""

from __future__ import annotations

import json

import pytest

from harness.pytest_plugin.machine import is_timing

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
    span(1.5)
"""

OTHERS = """
import pytest
from spans import span

@pytest.mark.parametrize("i", range(8))
def test_other(i):
    span(0.25)
"""


def _overlaps(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mark: str) -> list[str]:
    """Run the timed file and the others on two workers: the other tests that ran while the timed
    one did."""
    spans = pytester.path / "spans"
    spans.mkdir()
    pytester.makepyfile(spans=SPANS.format(), test_a_timed=TIMED.format(mark=mark), test_b_others=OTHERS)
    monkeypatch.setenv("SPANS", str(spans))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=9)
    seen = [json.loads(p.read_text()) for p in spans.glob("*.json")]
    [timed] = [s for s in seen if "test_times_something" in s["test"]]
    return [s["test"] for s in seen if s is not timed and s["start"] < timed["end"] and s["end"] > timed["start"]]


def test_no_other_workers_test_runs_while_a_timing_test_does(pytester, monkeypatch):
    assert _overlaps(pytester, monkeypatch, "@pytest.mark.amp_timing") == []


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
