"""One outcome vocabulary: the dashboard's suite cell, diff's check status and qualify's capability
verdict rank every outcome the same way (Outcome.severity) and name it the same (Outcome.label),
from rows and from the tests' own results; a failed test never reads PASS anywhere."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.apps import dashboard as db
from harness.apps import diff as df
from harness.apps import qualify
from harness.numerics.verdict import Outcome
from harness.storage import report as rp

NODE = "suites/numerics/test_x.py::test_x[cpu]"


def _report(root: Path, name: str, outcomes: list[Outcome], tests: list[dict[str, Any]] | None = None) -> Path:
    rows = [
        rp.make_row(
            run_id=name, nodeid=NODE, suite="numerics", check="test_x", metric=f"m{i}", value=1.0, outcome=o
        ).as_dict()
        for i, o in enumerate(outcomes)
    ]
    meta = {
        "fingerprint": {"cpu_class": {"id": "cpu-test-t2"}},
        "primary_device": "cpu",
        "started": name,
        "test_results": tests or [],
    }
    return rp.write(root, name, rows, meta)


def _cell(path: Path) -> str:
    loaded = db.load_reports([path])
    return str(db.pass_fail_matrix(loaded.rows, loaded.runs, loaded.tests).loc["numerics", "cpu-test-t2"])


def _check(path: Path) -> Outcome:
    side = df.Side("A", rp.load(path))
    return df._checks(df._records(side), side.report.tests.to_dict("records"))[("numerics", "test_x[cpu]")]


def test_every_outcome_has_a_place_in_the_order_and_a_name():
    assert sorted(o.severity for o in Outcome) == list(range(len(Outcome)))
    assert len({o.label for o in Outcome}) == len(Outcome)
    assert {o for o in Outcome if o.fails_test} == {Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.HUNG, Outcome.CRASHED}
    # a test that crashed or hung is ranked with FAIL, above it: the run lost it
    assert {o for o in Outcome if o.broke} == {Outcome.HUNG, Outcome.CRASHED}
    assert all(o.severity > Outcome.FAIL.severity for o in Outcome if o.broke)
    assert all(o.severity > p.severity for o in Outcome if o.fails_test for p in Outcome if not p.fails_test)


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(Outcome, 2)), ids=lambda o: o.value)
def test_the_dashboard_and_diff_take_the_worst_of_two_rows_by_one_order(tmp_path, a, b):
    path = _report(tmp_path, "r", [a, b])
    worst = Outcome.worst([a, b])
    assert worst is not None
    assert _cell(path) == worst.label
    assert _check(path) is worst


@pytest.mark.parametrize(
    ("result", "rows", "verdict"),
    [
        ("passed", [Outcome.PASS], Outcome.PASS),
        ("passed", [Outcome.INCONCLUSIVE], Outcome.PASS),  # a test that expected an inconclusive verdict
        ("failed", [Outcome.PASS], Outcome.FAIL),  # a bare assert failed after a passing row
        ("error", [], Outcome.FAIL),
        ("failed", [Outcome.PASS, Outcome.INCONCLUSIVE], Outcome.INCONCLUSIVE),
        ("failed", [Outcome.INCONCLUSIVE, Outcome.FAIL], Outcome.FAIL),
        ("skipped", [Outcome.NOISY], Outcome.NOISY),
        ("passed", [Outcome.PASS, Outcome.UNJUDGED], Outcome.UNJUDGED),
        ("passed", [Outcome.PASS, Outcome.KNOWN], Outcome.KNOWN),
        ("xfailed", [], Outcome.KNOWN),
        ("skipped", [], Outcome.SKIP),
        ("hung", [Outcome.PASS], Outcome.HUNG),  # stopped at its time limit after a passing row
        ("crashed", [], Outcome.CRASHED),  # its process died before it recorded anything
        ("crashed", [Outcome.FAIL], Outcome.CRASHED),
    ],
)
def test_a_tests_own_result_decides_with_its_rows_everywhere(tmp_path, result, rows, verdict):
    """The run report keeps each test's result; the dashboard and diff read it with the rows, and
    qualify (from JUnit, with the row outcomes as labels) comes to the same verdict and name."""
    test = {"nodeid": NODE, "suite": "numerics", "result": result, "duration_s": 0.1, "message": "first line"}
    path = _report(tmp_path, "r", rows, [{**test, "verdict": Outcome.of_test(result, rows).value}])
    assert Outcome.of_test(result, rows) is verdict
    assert _cell(path) == verdict.label
    assert _check(path) is verdict
    junit = {"passed": "passed", "failed": "failure", "error": "error", "skipped": "skipped", "xfailed": "skipped"}
    junit |= {"hung": "hung", "crashed": "crashed"}  # what qualify reads of them from the run report
    labels = tuple(o.value for o in rows if o.severity > Outcome.PASS.severity)  # the recorder's JUnit labels
    case = qualify.Case("test_x[cpu]", junit[result], "first line", "numerics", labels)
    got = qualify._verdict("numerics", [case])
    expected = Outcome.SKIP if result == "xfailed" else verdict  # JUnit writes an xfail as a skip
    assert got.status is expected and qualify.table([got]).split()[1] == expected.label.split()[0]


def test_a_failed_test_whose_rows_all_passed_reads_fail_in_every_reader(tmp_path):
    """The case the issue measured: rows PASS, the test failed (INCONCLUSIVE lane): the suite cell,
    the check's status against a passing run, and the run's verdict all say so."""
    good = {
        "nodeid": NODE,
        "suite": "numerics",
        "result": "passed",
        "duration_s": 0.1,
        "message": "",
        "verdict": "pass",
    }
    bad = {**good, "result": "failed", "message": "AssertionError: lane INCONCLUSIVE", "verdict": "inconclusive"}
    a = _report(tmp_path / "a", "a", [Outcome.PASS], [good])
    b = _report(tmp_path / "b", "b", [Outcome.PASS], [bad])
    assert _cell(b) == "INCONCLUSIVE"
    d = df.diff(df.Side("A", rp.load(a)), df.Side("B", rp.load(b)))
    [check] = [c for c in d.changes if c.kind == "check"]
    assert (check.status, check.a, check.b) == (df.Status.REGRESSED, "PASS", "INCONCLUSIVE")
    loaded = db.load_reports([b])
    assert loaded.runs["verdict"].tolist() == ["INCONCLUSIVE"]


def test_a_report_before_test_results_reads_its_failed_count():
    rows = pd.DataFrame({"nodeid": [NODE], "suite": ["numerics"], "outcome": ["pass"]})
    tests = pd.DataFrame(columns=list(rp.TEST_COLUMNS))
    assert db.run_verdict(rows, tests, {"tests": {"passed": 3, "failed": 1}}) is Outcome.FAIL
    assert db.run_verdict(rows, tests, {"tests": {"passed": 3}}) is Outcome.PASS


def test_no_harness_module_compares_an_outcome_word_as_a_string():
    """Outcome words travel as Outcome: a comparison with a bare "fail" or "known" would not move
    with the vocabulary (and parses a stored value the enum already parses)."""
    import ast

    words = {o.value for o in Outcome} | {o.label for o in Outcome}
    found = []
    for path in sorted(Path(__file__).resolve().parents[1].joinpath("harness").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    if isinstance(side, ast.Constant) and side.value in words:
                        found.append(f"{path.name}:{node.lineno}: {side.value!r}")
    assert not found, f"compare with Outcome members instead: {found}"
