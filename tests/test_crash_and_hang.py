"""A crash or a hang is a result, not a lost run.

A project of a user's shape (the plugin installed, tests that record rows through ``amp_record``)
whose tests segfault, are SIGKILLed, sleep past their time limit or spin in native code: serially
the journal keeps every row and the next session (or ``amp-harness report recover``) makes the
report, the crashed test named with its signal; under xdist and ``--amp-isolate`` the report has
the crashed and hung results directly, ``run.json`` counts what pytest counts, ``qualify`` fails
the capability and the dashboard shows CRASHED and HUNG. And every speed measurement ends: a clock
that reads 0 or runs backwards, calls that slow down after sizing, a case past its cap, all come out
NOT JUDGED in bounded time.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers import inject, run_inner

from harness.apps import dashboard as db
from harness.apps.cli import main
from harness.domains.engines.bench import bench
from harness.domains.speed import calibration
from harness.domains.speed.workloads import WORKLOADS
from harness.numerics.verdict import Outcome
from harness.storage import journal as jr
from harness.storage import report as rp

HEADER = 'import pytest\npytestmark = pytest.mark.amp_capability("numerics")\n'

PASSING = HEADER + "def test_{name}(amp_record):\n    amp_record('{name}.value', 1.0)\n"

SEGFAULT = (
    HEADER + "import ctypes\n\n"
    "def test_b_segfaults(amp_record):\n"
    "    amp_record('b.before', 2.0)\n"
    "    ctypes.string_at(0)  # a crashing kernel's stand-in\n"
)

KILLED = (
    HEADER + "import os, signal\n\n"
    "def test_k_is_killed(amp_record):\n"
    "    amp_record('k.before', 3.0)\n"
    "    os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer's stand-in\n"
)

SLEEPS = (
    HEADER + "import time\n\n"
    "@pytest.mark.amp_timeout(1)\n"
    "def test_h_sleeps_past_its_limit(amp_record):\n"
    "    amp_record('h.before', 4.0)\n"
    "    time.sleep(60)\n"
)

SPINS = (
    HEADER + "@pytest.mark.amp_timeout(1)\n"
    "def test_s_spins_in_native_code(amp_record):\n"
    "    amp_record('s.before', 5.0)\n"
    "    sum(range(10**12))  # a C loop: no signal handler runs until it returns\n"
)


def _project(pytester: pytest.Pytester, **files: str) -> None:
    for name, text in files.items():
        (pytester.path / f"{name}.py").write_text(text, encoding="utf-8")


def _results(run_dir: Path) -> dict[str, dict]:
    meta = json.loads((run_dir / rp.RUN_JSON).read_text(encoding="utf-8"))
    return {t["nodeid"].split("::")[-1]: t for t in meta["test_results"]}


def _pytest_counts(result: pytest.RunResult) -> dict[str, int]:
    """pytest's own final counts ("3 failed, 3 passed in 10.1s")."""
    line = next(line for line in reversed(result.outlines) if re.search(r"\d+ (passed|failed)", line))
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|error|errors)\b", line)}


# -- the journal ------------------------------------------------------------------------------------
def test_every_record_is_in_the_journal_as_written_and_a_torn_line_is_skipped(tmp_path):
    j = jr.Journal.open(tmp_path / "j", "main", {"run_id": "r1", "run_meta": {"started": "t0"}})
    j.started("t.py::test_a", "a", "numerics")
    j.row(rp.make_row(run_id="r1", nodeid="t.py::test_a", suite="a", metric="m", value=1.0).as_dict())
    j.test({"nodeid": "t.py::test_a", "suite": "a", "result": "passed", "duration_s": 0.1, "message": ""})
    j.started("t.py::test_b", "b", "numerics")
    j.row(rp.make_row(run_id="r1", nodeid="t.py::test_b", suite="b", metric="n", value=2.0).as_dict())
    # read while the writer lives (no close): every record is on disk already
    (p,) = jr.read(tmp_path / "j")
    assert [r["metric"] for r in p.rows] == ["m", "n"] and list(p.tests) == ["t.py::test_a"]
    assert p.in_progress is not None and p.in_progress["nodeid"] == "t.py::test_b" and not p.closed
    assert jr.live(tmp_path / "j"), "a journal its process still writes is live"
    with pytest.raises(jr.JournalError, match="running session"):
        jr.recover(tmp_path / "j", how="test")
    j._fh.write('{"t": "row", "row": {"nodeid": "t.py::te')  # a power cut mid-record
    j._fh.flush()
    assert jr.read(tmp_path / "j")[0].torn == 1
    j._fh.close()  # the process is gone: its lock with it
    assert not jr.live(tmp_path / "j")
    report = jr.recover(tmp_path / "j", how="test")
    loaded = rp.load(report)
    assert sorted(loaded.rows["metric"]) == ["m", "n"]
    assert loaded.meta["interrupted"]["processes"][0]["torn_lines"] == 1
    assert {t["nodeid"]: t["verdict"] for t in loaded.meta["test_results"]} == {
        "t.py::test_a": "pass",
        "t.py::test_b": "crashed",
    }


@pytest.mark.parametrize(
    ("fault", "returncode", "outcome", "cause"),
    [
        ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 ...", None, Outcome.CRASHED, "SIGSEGV"),
        ("Fatal Python error: Aborted\n", None, Outcome.CRASHED, "SIGABRT"),
        ("", -9, Outcome.CRASHED, "SIGKILL"),
        ("", 137, Outcome.CRASHED, "SIGKILL"),
        ("", 3, Outcome.CRASHED, "exit status 3"),
        ("", None, Outcome.CRASHED, "killed without a trace"),
        ("Timeout (0:00:01.100000)!\nThread 0x1 (most recent call first):\n", None, Outcome.HUNG, "time limit"),
    ],
)
def test_a_broken_tests_ending_is_named_from_its_fault_record_or_exit_status(fault, returncode, outcome, cause):
    end = jr.ending(fault, returncode)
    assert end.outcome is outcome and cause in end.cause


# -- serial: the journal, recovered ---------------------------------------------------------------------
def test_a_segfault_in_a_serial_run_leaves_a_journal_the_next_session_recovers(pytester, capsys):
    """Three tests, the second a segfault: pytest dies with SIGSEGV and no report; the journal holds
    the first test's row and result and the crashed test's start. ``amp-harness report recover``
    makes the report: the passing row, the crashed test named with its signal and its last row."""
    _project(pytester, test_a=PASSING.format(name="a"), test_b=SEGFAULT, test_c=PASSING.format(name="c"))
    out = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--amp-report-dir={out}")
    assert result.ret in (-signal.SIGSEGV, 128 + signal.SIGSEGV), result.stdout.str()[-2000:]
    assert not rp.find_runs(out), "the dying session wrote no report"
    [journal] = out.glob(f"{jr.PREFIX}*")
    capsys.readouterr()
    assert main(["report", "recover", str(out)]) == 0
    said = capsys.readouterr().out
    assert "test_b_segfaults" in said and "SIGSEGV" in said, said
    [run] = rp.find_runs(out)
    assert not journal.exists(), "a recovered journal is removed"
    results = _results(run)
    assert results["test_a"]["verdict"] == "pass"
    crashed = results["test_b_segfaults"]
    assert crashed["result"] == crashed["verdict"] == Outcome.CRASHED.value
    assert "SIGSEGV" in crashed["message"] and "b.before" in crashed["message"]
    assert "test_b_segfaults" in crashed["detail"], "the fault handler's traceback is kept"
    assert "test_c" not in results, "the run ended at the crash"
    loaded = rp.load(run)
    assert sorted(loaded.rows["metric"]) == ["a.value", "b.before"]
    assert loaded.meta["interrupted"]["broken"][0]["result"] == "crashed"
    assert loaded.meta["tests"] == {"passed": 1, "failed": 1}


def test_the_next_session_in_the_report_directory_recovers_a_dead_sessions_journal(pytester, tmp_path):
    """A journal nobody holds (its process died) becomes a report at the next session's start."""
    out = pytester.path / "reports"
    j = jr.Journal.open(jr.directory_of(out, "dead-run"), "main", {"run_id": "dead-run", "run_meta": {}})
    j.started("test_x.py::test_x", "x", None)
    j.row(rp.make_row(run_id="dead-run", nodeid="test_x.py::test_x", suite="x", metric="m", value=1.0).as_dict())
    j._fh.close()  # the process "dies": its lock goes, no closing record
    pytester.makepyfile(test_next="def test_next(amp_record):\n    amp_record('n', 1.0)\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--amp-report-dir={out}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*an interrupted run's journal, recovered*", "*CRASHED test_x.py::test_x*"])
    assert (out / "dead-run" / rp.ROWS_PARQUET).is_file() and not jr.directory_of(out, "dead-run").exists()
    assert _results(out / "dead-run")["test_x"]["verdict"] == "crashed"


# -- xdist and isolation: the results directly ------------------------------------------------------
def test_under_xdist_a_crashed_killed_or_hung_test_is_a_result_and_the_counts_are_pytests(pytester):
    _project(
        pytester,
        test_a=PASSING.format(name="a"),
        test_b=SEGFAULT,
        test_c=PASSING.format(name="c"),
        test_k=KILLED,
        test_h=SLEEPS,
    )
    out = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", f"--amp-report-dir={out}")
    counts = _pytest_counts(result)
    assert counts == {"failed": 3, "passed": 2}, result.stdout.str()[-3000:]
    [run] = rp.find_runs(out)
    meta = json.loads((run / rp.RUN_JSON).read_text(encoding="utf-8"))
    assert meta["tests"] == counts, "run.json counts what pytest counts"
    results = _results(run)
    assert "SIGSEGV" in results["test_b_segfaults"]["message"] and results["test_b_segfaults"]["verdict"] == "crashed"
    assert "SIGKILL" in results["test_k_is_killed"]["message"] and results["test_k_is_killed"]["verdict"] == "crashed"
    hung = results["test_h_sleeps_past_its_limit"]
    assert hung["verdict"] == "hung" and "1 s time limit" in hung["message"]
    assert "time.sleep" in hung["detail"] or "test_h_sleeps_past_its_limit" in hung["detail"], "its threads' stacks"
    assert {results[t]["verdict"] for t in ("test_a", "test_c")} == {"pass"}
    assert {"b.before", "k.before", "a.value", "c.value", "h.before"} == set(rp.load(run).rows["metric"])
    assert not list(out.glob(f"{jr.PREFIX}*")), "the finished run's journal is gone"


#: fresh interpreters with torch, three worker processes in turn (13 s on 2 AVX2 cores): out of the
#: `pytest` budget, run by CI's standalone step (.ci/run)
@pytest.mark.amp_thorough
@pytest.mark.standalone_scripts
def test_isolation_goes_on_after_a_crash_and_a_native_hang_and_qualify_fails_the_capability(pytester):
    """``amp-harness qualify -- --amp-isolate``: a segfault and a test stuck in native code (the last
    resort ends its worker) do not end the run; the tests after them pass, the capability is
    CRASHED (exit 1), and the dashboard's matrix shows it."""
    _project(pytester, test_a=PASSING.format(name="a"), test_b=SEGFAULT, test_s=SPINS, test_z=PASSING.format(name="z"))
    out = pytester.path / "reports"
    result = pytester.run(
        "amp-harness", "qualify", ".", "--report-dir", str(out), "--", "-p", "no:cacheprovider", "--amp-isolate"
    )
    assert result.ret == 1, result.stdout.str()[-3000:]
    result.stdout.fnmatch_lines(["*numerics*CRASHED*test_b_segfaults*SIGSEGV*", "*NOT QUALIFIED*"])
    [run] = rp.find_runs(out)
    results = _results(run)
    assert results["test_s_spins_in_native_code"]["verdict"] == "hung"
    assert "the hard time limit ended the process" in results["test_s_spins_in_native_code"]["message"]
    assert "test_s_spins_in_native_code" in results["test_s_spins_in_native_code"]["detail"]
    assert results["test_z"]["verdict"] == "pass", "the run went on after the crash and the hang"
    loaded = db.load_reports([out])
    matrix = db.pass_fail_matrix(loaded.rows, loaded.runs, loaded.tests)
    assert set(matrix.stack()) >= {"CRASHED", "HUNG", "PASS"}, matrix


@pytest.mark.amp_thorough  # a fresh interpreter with torch that the last resort ends (CI's standalone step)
@pytest.mark.standalone_scripts
def test_a_serial_test_stuck_in_native_code_is_ended_and_recovered_hung_with_its_stacks(pytester):
    _project(pytester, test_s=SPINS)
    out = pytester.path / "reports"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--amp-report-dir={out}")
    assert result.ret == 1 and not rp.find_runs(out)
    assert main(["report", "recover", str(out)]) == 0
    [run] = rp.find_runs(out)
    hung = _results(run)["test_s_spins_in_native_code"]
    assert hung["verdict"] == "hung" and "Timeout" in hung["detail"]


@pytest.mark.parametrize("value", ["-1", "soon", "inf", "nan"])
def test_a_bad_time_limit_is_a_usage_error(pytester, value):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--amp-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-timeout=*expected a number of seconds, 0 or more*"])


# -- every measurement bounded ------------------------------------------------------------------------
@pytest.mark.parametrize("clock", ["clock_reads_zero", "clock_goes_backwards"])
def test_a_clock_that_stops_or_runs_backwards_leaves_the_speed_suite_not_judged_in_bounded_time(
    pytester, suite_copy, clock
):
    suite_copy("speed/test_amp_speed.py", conftest=False)
    inject(pytester, "speed", patches={"harness.domains.engines.bench.bench.CLOCKS": f"faults.speed.{clock}"})
    start = time.monotonic()
    run = run_inner(pytester, "-m", "not amp_thorough", f"--amp-report-dir={pytester.path / 'out'}")
    took = time.monotonic() - start
    assert not run.failed and not run.passed and run.skipped, run.text()
    rows = rp.load(rp.find_runs(pytester.path / "out")[0]).rows
    speedups = rows[rows["kind"] == "speedup"]
    measured = {str(n) for n in speedups["nodeid"]}  # every case the tier measures here (not one the kernels emulate)
    assert measured and measured <= run.skipped and set(speedups["outcome"]) == {Outcome.UNJUDGED.value}
    assert all("times nothing" in note for note in speedups["note"]), speedups["note"].tolist()
    assert took < bench.CASE_CAP_S, f"{took:.1f} s"


@pytest.mark.parametrize("clock", ["clock_reads_zero", "clock_goes_backwards"])
def test_a_calibration_with_a_broken_clock_ends_with_its_cases_not_judged(monkeypatch, clock):
    import faults.speed

    monkeypatch.setattr(bench, "CLOCKS", getattr(faults.speed, clock)(bench.CLOCKS))
    cases = [("matmul_256", "float16"), ("layer_norm", "bfloat16")]
    start = time.monotonic()
    results = calibration.calibrate(
        cases,
        WORKLOADS,
        torch.device("cpu"),
        runs=2,
        rounds=None,
        stored={},
        log=lambda _: None,
        hardware_class="x",
    )
    assert time.monotonic() - start < bench.CASE_CAP_S
    for r in results:
        assert not r.threshold.judged and "times nothing" in r.threshold.origin, r


def test_a_block_whose_calls_slow_down_after_sizing_stops_at_its_cap():
    """Sized on calls of 0.2 ms, the block's calls then take 20 ms: it stops at BLOCK_CAP_S, not at
    a hundred times its target."""
    slow = {"s": 2e-4}

    def fn() -> None:
        time.sleep(slow["s"])

    n = bench._iterations(fn, torch.device("cpu"), bench.BLOCK_S)
    assert n >= 2  # a block of several calls (one call cannot be cut); on a busy machine a sleep
    # of 0.2 ms takes longer and the block has fewer calls: slow them enough to pass the cap anyway
    slow["s"] = max(100 * 2e-4, 2 * bench.BLOCK_CAP_S / n)
    start = time.monotonic()
    with pytest.raises(bench.Capped, match="ran past its cap"):
        bench._time_block(fn, torch.device("cpu"), n)
    assert time.monotonic() - start < 2 * bench.BLOCK_CAP_S + slow["s"]


def test_a_block_is_sized_from_a_sizing_block_never_from_one_call(monkeypatch):
    """The calibration the issue saw: a call read as 0 s sized a block of 5 million calls. Sizing
    now reads the cap clock over several calls, whatever the judged clock says."""
    import faults.speed

    monkeypatch.setattr(bench, "CLOCKS", faults.speed.clock_reads_zero(bench.CLOCKS))

    def fn() -> None:
        time.sleep(1e-3)

    n = bench._iterations(fn, torch.device("cpu"), bench.BLOCK_S)
    assert 5 <= n <= 40, n  # about BLOCK_S / 1 ms


def test_a_case_past_its_cap_is_not_judged(monkeypatch):
    monkeypatch.setattr(bench, "CASE_CAP_S", 0.0)
    with pytest.raises(bench.Capped, match="the case ran past its cap"):
        bench.measure(WORKLOADS["matmul_256"], torch.device("cpu"), torch.float16, probe=False)


@pytest.mark.parametrize("before", ["passed", "failed"])
def test_diff_ranks_a_test_that_crashed_or_hung_in_b_a_regression(tmp_path, before):
    """Even from a failure: B lost the test, A at least judged it."""
    from harness.apps import diff as df

    node = "suites/numerics/test_x.py::test_x"
    row = rp.make_row(run_id="r", nodeid=node, suite="numerics", metric="m", value=1.0, outcome=Outcome.PASS)

    def run(name: str, result: str) -> Path:
        test = {"nodeid": node, "suite": "numerics", "result": result, "duration_s": 1.0, "message": result}
        verdict = Outcome.of_test(result, [Outcome.PASS]).value
        return rp.write(tmp_path, name, [row.as_dict()], {"test_results": [{**test, "verdict": verdict}]})

    a = rp.load(run("a", before))
    for broken in ("crashed", "hung"):
        d = df.diff(df.Side("A", a), df.Side("B", rp.load(run(f"b-{broken}", broken))))
        [check] = [c for c in d.changes if c.kind == "check"]
        assert check.status is df.Status.REGRESSED and check.b == broken.upper(), check


CUT = (
    HEADER + "import os, pathlib, signal\n\n"
    "def test_m_is_cut_by_the_device_window(amp_record):\n"
    "    amp_record('m.before', 6.0)\n"
    "    mark = pathlib.Path(__file__).with_name('cut-once')\n"
    "    if not mark.exists():  # the first part: the device's time ends, every process of the run with it\n"
    "        mark.write_text('cut')\n"
    "        os.killpg(os.getpgid(0), signal.SIGKILL)\n"
)


@pytest.mark.amp_thorough  # two qualifications in fresh interpreters, one killed: CI's standalone step
@pytest.mark.standalone_scripts
def test_a_qualification_cut_short_resumes_running_only_what_is_missing(pytester):
    """The device window ends during a test (the whole process group killed); the same command
    again recovers the first part's journal, runs only the cut test and the ones after it, and
    judges every part together."""
    import subprocess
    import sys

    _project(pytester, test_a=PASSING.format(name="a"), test_m=CUT, test_z=PASSING.format(name="z"))
    out = pytester.path / "reports"
    cmd = [sys.executable, "-m", "harness.apps.cli", "qualify", ".", "--resume", "--report-dir", str(out), "--"]
    cmd += ["-p", "no:cacheprovider", "--amp-isolate"]
    first = subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, start_new_session=True, check=False)
    assert first.returncode == -signal.SIGKILL, first.stdout[-2000:]
    assert list(out.glob(f"{jr.PREFIX}*")) and not rp.find_runs(out), "the cut part left its journal, no report"
    second = subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, start_new_session=True, check=False)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "an earlier part's journal, recovered" in second.stdout
    assert "resumed: 1 tests finished in earlier parts" in second.stdout, second.stdout[-3000:]
    assert re.search(r"numerics\s+PASS\s+3 passed", second.stdout), second.stdout[-2000:]
    earlier, now = rp.find_runs(out)
    assert set(_results(earlier)) == {"test_a", "test_m_is_cut_by_the_device_window"}
    assert set(_results(now)) == {"test_m_is_cut_by_the_device_window", "test_z"}, "only what was missing ran"


def test_a_test_cut_once_runs_again_and_one_cut_twice_is_finished(tmp_path):
    """The test a cut session was running may have been ended by the cut: it runs again, once. Cut
    short in two parts, it is the test that ends its process: running it a third time only ends
    the next part too."""

    def part(name: str, results: dict[str, str], broken: tuple[str, ...] = ()) -> None:
        tests = [{"nodeid": n, "suite": "s", "result": r, "verdict": r} for n, r in results.items()]
        interrupted = {"broken": [{"nodeid": n, "result": "crashed", "message": "killed"} for n in broken]}
        rp.write(tmp_path, name, [], {"run_id": name, "test_results": tests, "interrupted": interrupted})

    part("p1", {"a": "passed", "m": "crashed"}, broken=("m",))
    assert jr.finished_tests(tmp_path) == {"a": "p1"}
    part("p2", {"m": "crashed"}, broken=("m",))
    assert jr.finished_tests(tmp_path) == {"a": "p1", "m": "p2"}
