"""The run report: rows recorded by suites land in parquet/CSV/run.json and load back with pandas."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from harness.platform.hardware import machine_threads
from harness.storage import report as rp

TEST_FILE = """
import pytest

@pytest.mark.parametrize("i", range(6))
def test_records(amp_record, amp_device, i):
    amp_record("metric", i * 0.5, unit="s", expected=1.0, allowance=0.25, outcome="pass", device=amp_device,
               dtype="bfloat16", tags={"i": i})
    amp_record("other", None, outcome="info", note="a text finding")
"""
QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


def _only_run(report_dir):
    runs = rp.find_runs(report_dir)
    assert len(runs) == 1, runs
    return rp.load(runs[0])


def test_rows_are_written_as_parquet_csv_and_run_json_and_load_back(pytester):
    pytester.makepyfile(test_rep=TEST_FILE)
    result = pytester.runpytest(*QUIET, "--amp-report-dir=out")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*run report: 12 rows (6 pass, 6 info) -> out/*"])
    loaded = _only_run(pytester.path / "out")
    df = loaded.rows
    assert list(df.columns) == list(rp.LOADED_COLUMNS)
    assert len(df) == 12
    assert df["run_id"].nunique() == 1
    assert df["run_id"].iloc[0] == loaded.meta["run_id"]
    row = df[(df.metric == "metric")].sort_values("value").iloc[1]
    assert (row.value, row.unit, row.expected, row.allowance, row.outcome) == (0.5, "s", 1.0, 0.25, "pass")
    assert (row["dtype"], row.device, row.suite, row.check) == ("bfloat16", "cpu", "rep", "test_records")
    assert row.profile == loaded.meta["fingerprint"]["cpu_profile"]
    assert json.loads(row.tags) == {"i": 1}
    assert pd.isna(df[df.metric == "other"].value).all()
    csv = pd.read_csv(loaded.path / rp.ROWS_CSV)
    assert len(csv) == 12
    meta = loaded.meta
    assert meta["schema_version"] == rp.SCHEMA_VERSION
    assert meta["tests"] == {"passed": 6}
    for key in ("started", "finished", "git_commit", "harness_version", "fingerprint", "options", "profile"):
        assert key in meta
    fp = meta["fingerprint"]
    assert {"cpu", "gpus", "torch_version", "python_version", "hostname", "cpu_profile"} <= fp.keys()
    assert loaded.run["fingerprint.cpu.model"].iloc[0] == fp["cpu"]["model"]


THREADS_FILE = """
import torch

def test_threads(amp_record, amp_device):
    amp_record("torch_threads", torch.get_num_threads(), outcome="info", device=amp_device)
"""


def test_rows_are_neither_lost_nor_duplicated_under_xdist(pytester):
    """And each worker runs torch on its share of the cores, recorded in run.json with its class."""
    import os

    pytester.makepyfile(test_rep=TEST_FILE, test_threads=THREADS_FILE)
    result = pytester.runpytest_subprocess(*QUIET, "-n", "2", "--amp-report-dir=out")
    result.assert_outcomes(passed=7)
    loaded = _only_run(pytester.path / "out")
    df = loaded.rows
    assert len(df) == 13
    keys = df[df.metric == "metric"]["nodeid"]
    assert keys.is_unique
    assert len(keys) == 6
    assert df["run_id"].nunique() == 1
    tests = loaded.tests  # each test's own result, merged from the workers
    assert len(tests) == 7 and tests["nodeid"].is_unique and set(tests["result"]) == {"passed"}
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert df[df.metric == "torch_threads"]["value"].iloc[0] == share
    workers = loaded.meta["xdist_workers"]
    assert sorted(w["id"] for w in workers) == ["gw0", "gw1"]
    used = [w for w in workers if w["threads"]]
    assert used and all(w["threads"].startswith(f"{share} torch threads") for w in used), workers
    # the class names the machine (the threads a process with it to itself runs), not the share:
    # the class calibration writes, which judges the workers' speed cases
    machine = f"-t{machine_threads()}"
    assert all(w["hardware_class"] is None or w["hardware_class"].endswith(machine) for w in used), workers


RESULTS_FILE = """
import pytest


def test_passes(amp_record):
    amp_record("m", 1.0)


def test_fails(amp_record):
    amp_record("m", 1.0)
    assert 1 == 2, "one is not two"


def test_skips():
    pytest.skip("nothing to run here")


@pytest.mark.xfail(reason="a known deviation")
def test_xfails():
    assert False


@pytest.fixture
def broken():
    raise RuntimeError("the fixture broke")


def test_errors(broken):
    pass
"""


def test_each_tests_own_result_is_in_the_run_report_beside_its_rows(pytester):
    """passed, failed, skipped, xfailed, error: the result, a duration, the first line of the failure
    or skip, and the verdict every reader uses (Outcome.of_test)."""
    pytester.makepyfile(test_results=RESULTS_FILE)
    pytester.runpytest(*QUIET, "--amp-report-dir=out")
    tests = _only_run(pytester.path / "out").tests.set_index("nodeid")
    got = {n.split("::")[1]: (r.result, r.verdict) for n, r in tests.iterrows()}
    assert got == {
        "test_passes": ("passed", "pass"),
        "test_fails": ("failed", "fail"),
        "test_skips": ("skipped", "skip"),
        "test_xfails": ("xfailed", "known"),
        "test_errors": ("error", "fail"),
    }
    assert tests["duration_s"].ge(0).all()
    messages = dict(zip([n.split("::")[1] for n in tests.index], tests["message"], strict=True))
    assert messages["test_fails"].startswith("AssertionError: one is not two"), messages
    assert "nothing to run here" in messages["test_skips"] and "the fixture broke" in messages["test_errors"]


def test_worker_threads_share_the_cores_unless_told_otherwise():
    from harness.pytest_plugin.options import worker_threads

    assert worker_threads("auto", 2, 2, None) == (1, "2 CPUs shared by 2 xdist workers")
    assert worker_threads("auto", 8, 32, None)[0] == 4
    assert worker_threads("auto", 4, 2, None)[0] == 1  # never 0
    assert worker_threads("auto", 2, 2, "3")[0] is None  # OMP_NUM_THREADS: the user said
    assert worker_threads("off", 2, 2, None)[0] is None
    assert worker_threads("3", 2, 2, None)[0] == 3


def test_a_bad_worker_threads_value_is_a_usage_error(pytester):
    pytester.makepyfile(test_rep=TEST_FILE)
    result = pytester.runpytest(*QUIET, "--amp-worker-threads=0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-worker-threads='0': expected auto, off or a positive integer*"])


def test_no_report_when_no_check_records_anything(pytester):
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    pytester.runpytest(*QUIET, "--amp-report-dir=out").assert_outcomes(passed=1)
    assert not (pytester.path / "out").exists()


def test_no_report_option(pytester):
    pytester.makepyfile(test_rep=TEST_FILE)
    pytester.runpytest(*QUIET, "--amp-no-report", "--amp-report-dir=out").assert_outcomes(passed=6)
    assert not (pytester.path / "out").exists()


def test_load_names_the_problem(tmp_path):
    with pytest.raises(rp.ReportError, match=r"no rows\.parquet"):
        rp.load(tmp_path)
    run = rp.write(tmp_path, "r1", [], {"x": 1})
    (run / rp.RUN_JSON).write_text(json.dumps({"schema_version": rp.SCHEMA_VERSION + 1}))
    with pytest.raises(rp.ReportError, match="newer than this harness reads"):
        rp.load(run)
    (run / rp.ROWS_PARQUET).write_bytes(b"PAR1 garbage")
    (run / rp.RUN_JSON).write_text("{}")
    with pytest.raises(rp.ReportError, match="unreadable parquet"):
        rp.load(run)


def test_an_empty_run_still_has_the_schema(tmp_path):
    run = rp.write(tmp_path, "r1", [], {})
    assert list(rp.load(run).rows.columns) == list(rp.LOADED_COLUMNS)


def test_rows_reject_unknown_outcomes():
    with pytest.raises(ValueError, match="is not one of"):
        rp.make_row(run_id="r", nodeid="n", suite="s", check="c", metric="m", value=1, outcome="great")


def test_a_rows_keywords_are_declared_once_beside_its_columns():
    """The recorder passes a row's keywords through: RowFields (report.py) is their one list, and
    every key is a column of Row; a keyword that is no column is refused, naming the columns."""
    assert set(rp.RowFields.__annotations__) <= set(rp.COLUMNS)
    with pytest.raises(TypeError, match="no report column colour"):
        rp.make_row(run_id="r", nodeid="n", suite="s", metric="m", value=1.0, colour="red")


def test_a_version_1_report_still_loads(tmp_path):
    """Schema 2 added the ``unjudged`` outcome; version-1 reports load unchanged."""
    row = rp.make_row(run_id="r", nodeid="n", suite="s", check="c", metric="m", value=1.0, outcome="pass")
    run = rp.write(tmp_path, "r", [row.as_dict()], {})
    meta = json.loads((run / rp.RUN_JSON).read_text())
    (run / rp.RUN_JSON).write_text(json.dumps({**meta, "schema_version": 1}))
    loaded = rp.load(run)
    assert loaded.meta["schema_version"] == 1 and loaded.rows["outcome"].tolist() == ["pass"]


def test_judged_rows_are_comparable_and_information_is_not():
    def row(outcome, **kw):
        return rp.make_row(run_id="r", nodeid="n", suite="s", check="c", metric="m", value=1.0, outcome=outcome, **kw)

    assert (row("pass").comparable, row("pass").drift) == (True, 0.0)
    assert (row("fail").comparable, row("known").comparable) == (True, True)
    for info in ("info", "unjudged", "noisy", "skip", "inconclusive"):
        assert (row(info).comparable, row(info).drift) == (False, None), info
    assert row("pass", drift=0.14).drift == 0.14
    assert row("pass", comparable=False).comparable is False


def test_property_examples_do_not_depend_on_the_modules_loaded_before(tmp_path):
    """A derandomized property run draws the same examples whether or not another local module
    (a conftest, a harness module another suite imports) was loaded first; without the plugin's
    guard hypothesis harvests that module's constants and the examples change (the control). In a
    fresh interpreter: this test itself runs under the guard."""
    import subprocess
    import sys

    (tmp_path / "amp_local_constants.py").write_text(
        "VALUES = [" + ", ".join(str(9973 * k) for k in range(1, 80)) + "]\n", encoding="utf-8"
    )
    script = tmp_path / "draw.py"
    script.write_text(
        """
import importlib, json, sys
from hypothesis import given, settings, strategies as st
from harness.pytest_plugin.examples import independent_of_loaded_modules

drawn = []

@settings(derandomize=True, max_examples=200, database=None)
@given(st.integers(0, 10**6))
def prop(x):
    drawn.append(x)

def collect(guarded):
    drawn.clear()
    if guarded:
        with independent_of_loaded_modules():
            prop()
    else:
        prop()
    return list(drawn)

before = (collect(True), collect(False))
sys.path.insert(0, sys.argv[1])
importlib.import_module("amp_local_constants")
after = (collect(True), collect(False))
print(json.dumps({"guarded_same": before[0] == after[0], "unguarded_same": before[1] == after[1]}))
""",
        encoding="utf-8",
    )
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["guarded_same"], result
    assert not result["unguarded_same"], f"hypothesis no longer harvests local constants: the guard may go ({result})"
