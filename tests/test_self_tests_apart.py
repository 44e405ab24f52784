"""The project's tests of itself (ini ``amp_self_tests``) are not the stack's qualification: their
rows and results carry origin ``self-test``, the dashboard's matrix and drill-down show only the
qualification's suites (the self-tests in one line), qualify judges no capability from them, and
diff lists them apart without letting them set its exit status. A project that names none keeps
every test in the qualification."""

from __future__ import annotations

import os

from harness.apps import dashboard, qualify
from harness.apps import diff as df_
from harness.storage import report as rp

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")

OWN = """
import pytest
from harness.numerics.comparison import compare_claim

@pytest.mark.amp_capability("formats")   # a self-test never decides a capability, marked or not
def test_the_harness_reads_its_reports(amp_record):
    amp_record.require(compare_claim("own.reads", 1, {holds}, "the harness reads what it wrote"))
"""
SUITE = """
import pytest
from harness.numerics.comparison import compare_claim

@pytest.mark.amp_capability("formats")
def test_fp16_max(amp_record):
    amp_record.require(compare_claim("fp16.max", 65504.0, True, "largest finite fp16"))
"""


def _project(pytester, holds: bool, own: bool = True) -> None:
    pytester.makeini("[pytest]\n" + ("amp_self_tests = tests\n" if own else ""))
    (pytester.path / "tests").mkdir(exist_ok=True)
    (pytester.path / "suites" / "formats").mkdir(parents=True, exist_ok=True)
    (pytester.path / "tests" / "test_own.py").write_text(OWN.format(holds=holds))
    (pytester.path / "suites" / "formats" / "test_limits.py").write_text(SUITE)


def _run(pytester, report_dir: str) -> rp.LoadedReport:
    pytester.runpytest(*QUIET, f"--amp-report-dir={report_dir}", "tests", "suites")
    return rp.load(rp.find_runs(pytester.path / report_dir)[-1])


def test_rows_and_results_say_where_they_come_from(pytester):
    _project(pytester, holds=True)
    loaded = _run(pytester, "out")
    assert loaded.meta[rp.SELF_TESTS] == ["tests/"]
    origins = dict(zip(loaded.rows["metric"], loaded.rows["origin"], strict=True))
    assert origins == {"own.reads": rp.SELF_TEST, "fp16.max": rp.QUALIFICATION}
    assert dict(zip(loaded.tests["suite"], loaded.tests["origin"], strict=True)) == {
        "own": rp.SELF_TEST,
        "formats": rp.QUALIFICATION,
    }
    # a self-test decides no capability, whatever its marker says
    capabilities = dict(zip(loaded.tests["suite"], loaded.tests["capability"], strict=True))
    assert capabilities["formats"] == "formats" and not isinstance(capabilities["own"], str)


def test_a_project_that_names_no_self_tests_keeps_every_test_in_the_qualification(pytester):
    _project(pytester, holds=True, own=False)
    loaded = _run(pytester, "out")
    assert set(loaded.rows["origin"]) == {rp.QUALIFICATION}


def test_the_dashboard_matrix_shows_the_qualification_and_the_self_tests_in_one_line(pytester):
    _project(pytester, holds=False)
    _run(pytester, "out")
    loaded = dashboard.load_reports([pytester.path / "out"])
    matrix = dashboard.pass_fail_matrix(loaded.rows, loaded.runs, loaded.tests)
    assert list(matrix.index) == ["formats"]
    assert set(matrix.iloc[:, 0]) == {"PASS"}
    (line,) = dashboard.self_test_health(loaded.rows, loaded.runs, loaded.tests)
    assert (
        "harness self-tests: 1 tests (1 FAIL); first FAIL: tests/test_own.py::test_the_harness_reads_its_reports"
        in line
    )
    assert loaded.runs["verdict"].tolist() == ["PASS"]  # the run's verdict is the stack's
    page = dashboard.render(loaded)
    assert "The project's tests of itself" in page and "cell-own--" not in page


def test_qualify_ignores_the_self_tests_and_says_how_they_did(pytester, capsys):
    _project(pytester, holds=False)
    os.chdir(pytester.path)
    code = qualify.run(["tests", "suites", "-p", "no:cacheprovider"], pytester.path / "q")
    out = capsys.readouterr().out
    assert code == 0, out  # the failing self-test, marked "formats" too, does not fail the capability
    assert "project self-tests (not part of the verdict): 1 tests, 1 failed" in out
    verdict = {v.capability: v for v in qualify.verdicts(pytester.path / "q" / "junit-qualify.xml")}["formats"]
    assert verdict.tests == 1 and verdict.status is qualify.Outcome.PASS


def test_diff_lists_a_regressed_self_test_apart_and_never_exits_on_it(pytester):
    _project(pytester, holds=True)
    a = _run(pytester, "a")
    _project(pytester, holds=False)
    b = _run(pytester, "b")
    d = df_.diff(df_.Side("A", a), df_.Side("B", b))
    assert not d.regressed and d.count(df_.Status.REGRESSED, self_tests=True) == 1
    assert d.self_test_suites == {"own"}
    text = df_.render_text(d)
    assert text.index("formats") < text.index(df_.SELF_TEST_HEADING) < text.index("own:")
    assert "project self-tests apart: 1 regressed" in d.summary()
    assert "self-test" in df_.render_csv(d)
