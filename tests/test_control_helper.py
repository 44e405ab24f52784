"""The negative-control helper can fail: a catch must be exactly the named tests, on judged rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import InnerRun, assert_caught, assert_clean


def _run(passed=(), failed=(), skipped=(), rows=()) -> InnerRun:
    result = SimpleNamespace(stdout=SimpleNamespace(str=lambda: ""))
    return InnerRun(result, frozenset(passed), frozenset(failed), frozenset(skipped), tuple(rows))  # type: ignore[arg-type]


def test_a_catch_is_exactly_the_named_tests_each_failed_on_a_judged_row():
    caught = _run(failed=["s.py::test_a"], rows=[{"nodeid": "s.py::test_a", "outcome": "fail"}])
    assert_caught(caught, "*::test_a")
    with pytest.raises(AssertionError, match="not failed"):
        assert_caught(_run(passed=["s.py::test_a"]), "*::test_a")  # nothing failed: no catch
    with pytest.raises(AssertionError, match="failed besides"):
        assert_caught(_run(failed=["s.py::test_a", "s.py::test_b"]), "*::test_a")  # something else broke
    noisy = _run(failed=["s.py::test_a"], rows=[{"nodeid": "s.py::test_a", "outcome": "noisy"}])
    with pytest.raises(AssertionError, match="judged nothing"):
        assert_caught(noisy, "*::test_a")


def test_a_clean_run_needs_no_failure_and_enough_passes():
    assert_clean(_run(passed=["a", "b"]), at_least=2)
    with pytest.raises(AssertionError, match="a clean run failed"):
        assert_clean(_run(passed=["a", "b"], failed=["c"]), at_least=2)
    with pytest.raises(AssertionError, match="fewer than the 2"):
        assert_clean(_run(passed=["a"], skipped=["b"]), at_least=2)
