"""The known answers can fail, and a clean card passes them: a card's answers recorded on a clean
run (``--amp-regen``) are given again bit for bit by a clean rerun in other processes (the
project's two workers), a card with a stuck lane in its bf16 GEMM unit (one ulp, one column in 64)
fails exactly the computations through that unit, naming the first differing element and its bits,
and ``amp-harness burn-in`` exits 0 clean and 1 under an intermittent bit flip, naming the op."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO, assert_caught, assert_clean, inject, outside_this_run, project_configuration, run_inner

from harness.apps.cli import main
from harness.domains.known_answers import answers as ka
from harness.domains.known_answers import burn_in as B

FILE = "known_answers/test_known_answers.py"
TEST = "test_the_card_gives_the_known_answer_its_class_recorded_bit_for_bit"
#: the computations whose GEMMs run on the bf16 unit the faults break
BF16_GEMMS = ("addmm_bf16", "bmm_bf16", "linear_bf16")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A baseline dir holding this card's answers, recorded by the suite itself (``--amp-regen``) on
    a clean run, in a process of its own."""
    root = tmp_path_factory.mktemp("answers")
    cmd = [sys.executable, "-m", "pytest", "suites/known_answers", "--amp-regen", f"--amp-baseline-dir={root}"]
    subprocess.run([*cmd, "-n", "0", "-p", "no:cacheprovider", "-q", "--amp-no-report"], cwd=REPO, capture_output=True,
                   timeout=300, check=False)  # fmt: skip
    assert list((root / "known_answers").rglob("*.json")), f"--amp-regen recorded nothing under {root}"
    return root


def _suite(pytester, suite_copy, kernels: tuple[str, ...] = ()) -> None:
    suite_copy(FILE, conftest=False)
    inject(pytester, "known_answers", kernels=kernels)


def test_a_clean_card_gives_the_answers_it_recorded_in_another_process(pytester, suite_copy, recorded):
    """Recorded by the suite's own --amp-regen in one process, judged in this one: the answers are
    bitwise reproducible across processes (measured here, every run)."""
    _suite(pytester, suite_copy)
    assert_clean(run_inner(pytester, f"--amp-baseline-dir={recorded}"), at_least=len(ka.COMPUTATIONS) - 1)


@pytest.mark.amp_thorough  # a fresh interpreter and two workers: about 10 s
@pytest.mark.as_users_run_it
def test_on_the_projects_two_workers_a_clean_card_gives_its_recorded_answers(
    pytester, suite_copy, recorded, monkeypatch
):
    _suite(pytester, suite_copy)
    project_configuration(pytester)
    outside_this_run(monkeypatch)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--amp-device=cpu", f"--amp-baseline-dir={recorded}"
    )
    result.stdout.fnmatch_lines(["*created: 2/2 workers*"])
    assert result.ret == 0 and result.parseoutcomes().get("passed", 0) >= len(ka.COMPUTATIONS) - 1, result.stdout.str()


def test_without_recorded_answers_a_card_is_not_judged_and_told_how_to_record_them(pytester, suite_copy, tmp_path):
    _suite(pytester, suite_copy, kernels=("bf16_gemm_stuck_lane",))  # even a defective card: nothing to hold it to
    run = run_inner(pytester, f"--amp-baseline-dir={tmp_path}", "-rs")
    assert not run.failed and not run.passed and run.skipped
    run.stdout.fnmatch_lines(
        ["*NOT JUDGED: no known answers recorded for cpu-*pytest suites/known_answers --amp-regen*"]
    )


def test_a_card_with_a_stuck_lane_fails_exactly_its_bf16_gemms_naming_the_bits(pytester, suite_copy, recorded):
    _suite(pytester, suite_copy, kernels=("bf16_gemm_stuck_lane",))
    run = run_inner(pytester, f"--amp-baseline-dir={recorded}", "--amp-report-dir=out")
    assert_caught(run, *(f"*::{TEST}[[]cpu-{name}]" for name in BF16_GEMMS))
    run.stdout.fnmatch_lines(["*differ bitwise; first at flat index 0: expected * (bits 0x*), observed * (bits 0x*)*"],
                             consecutive=False)  # fmt: skip
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(pytester.path / "scripts")]) == 0
    assert len(list((pytester.path / "scripts").glob("*.py"))) == len(BF16_GEMMS)


def test_the_burn_in_exits_0_clean_and_1_under_an_intermittent_flip_naming_the_op(recorded, tmp_path, capsys):
    """One bf16 GEMM call in 300 with one flipped bit: caught within a few seconds against the
    recorded answers, classified by its replays, journaled, and written as a script."""
    assert (
        main(["burn-in", "--minutes", "0.02", "--baseline-dir", str(recorded), "--report-dir", str(tmp_path / "a")])
        == 0
    )
    assert "CLEAN" in capsys.readouterr().out
    sys.path.insert(0, str(Path(__file__).parent))
    import faults.stacks

    lib = faults.stacks.register("bf16_gemm_intermittent_flip")
    try:
        code = main(
            ["burn-in", "--minutes", "0.1", "--baseline-dir", str(recorded), "--report-dir", str(tmp_path / "b")]
        )
    finally:
        lib._destroy()
    out = capsys.readouterr().out
    assert code == 1, out
    assert any(f"MISMATCH {name}" in out for name in BF16_GEMMS), out
    events = [json.loads(line) for line in (tmp_path / "b" / "burn-in.jsonl").read_text().splitlines()]
    findings = [e for e in events if e["event"] == "finding"]
    assert findings and {e["computation"] for e in findings} <= set(BF16_GEMMS)
    assert {e["kind"] for e in findings} <= {"transient", "intermittent"}  # a flip in 1 of 300 calls does not persist
    assert events[-1]["event"] == "end" and events[-1]["mismatches"] == len(findings)
    assert list((tmp_path / "b").glob("burn_in_*.py"))


def test_a_mismatch_is_classified_by_its_replays():
    """persistent: every replay disagrees; intermittent: some; transient: none (the rerun rule)."""
    where = ka.Mismatch(0, 1.0, 2.0, 1, 2, 1, 1)
    kinds = [B.Finding("x", 1, "r", where, n, 5, torch.empty(0), torch.empty(0)).kind for n in (5, 2, 0)]
    assert kinds == [B.Kind.PERSISTENT, B.Kind.INTERMITTENT, B.Kind.TRANSIENT]


def test_bad_burn_in_options_are_usage_errors(capsys, tmp_path):
    assert main(["burn-in", "--minutes", "0", "--report-dir", str(tmp_path)]) == 2
    assert "--minutes must be positive" in capsys.readouterr().err


def test_the_fleet_rule_names_the_host_that_disagrees_with_the_majority():
    from harness.domains.known_answers.fleet import Observation, outliers

    def seen(host, started, digest):
        return Observation("cls", "torch-2.13", "linear_bf16", host, started, digest)

    found = outliers([seen("a", "1", "x"), seen("b", "1", "x"), seen("c", "1", "y"), seen("c", "2", "y"),
                      seen("d", "1", "y"), seen("d", "2", "x")])  # fmt: skip
    assert [(o.host, o.majority, o.hosts_agreeing, o.hosts, o.runs_disagreeing, o.runs) for o in found] == [
        ("c", "x", 3, 4, 2, 2)  # d's latest answer agrees: its old disagreement is history, not an outlier now
    ]
    two = outliers([seen("a", "1", "x"), seen("b", "1", "y")])
    assert [(o.host, o.majority) for o in two] == [("a", None), ("b", None)]  # no majority: undecided
    assert outliers([seen("a", "1", "x")]) == []


@pytest.mark.amp_thorough  # three runs of the suite: about 11 s
def test_the_dashboard_lists_the_card_with_a_stuck_lane_among_its_fleet(pytester, suite_copy, recorded, tmp_path):
    """Three hosts of one class publish their known answers; the one with a stuck bf16 lane is the
    dashboard's outlier, computation by computation."""
    from harness.apps import dashboard as db

    reports = []
    for host, kernels in (("node-a", ()), ("node-b", ()), ("node-c", ("bf16_gemm_stuck_lane",))):
        _suite(pytester, suite_copy, kernels=kernels)
        out = tmp_path / host
        run_inner(pytester, f"--amp-baseline-dir={recorded}", f"--amp-report-dir={out}")
        [run] = [d for d in out.iterdir() if d.is_dir()]
        meta = json.loads((run / "run.json").read_text())
        meta["fingerprint"]["hostname"] = host
        (run / "run.json").write_text(json.dumps(meta))
        reports.append(run)
    odd = db.known_answer_outliers(db.load_reports(reports))
    assert set(odd["host"]) == {"node-c"} and set(odd["computation"]) == set(BF16_GEMMS)
    assert set(odd["hosts agreeing"]) == {"2 of 3"}


def test_an_audit_names_the_odd_device_and_two_devices_need_the_recorded_answers_to_decide():
    """Three devices, one with a stuck bf16 lane (its answers computed here with the fault in force):
    the odd one by majority. Two devices that disagree are undecided; the recorded answers decide."""
    from harness.apps.audit import RECORDED, judge

    sys.path.insert(0, str(Path(__file__).parent))
    import faults.stacks

    cpu = torch.device("cpu")
    healthy = {n: ka.digest(ka.answer(n, cpu)) for n in BF16_GEMMS}
    lib = faults.stacks.register("bf16_gemm_stuck_lane")
    try:
        stuck = {n: ka.digest(ka.answer(n, cpu)) for n in BF16_GEMMS}
    finally:
        lib._destroy()
    odd = judge("cls", "torch-2.13", {"cuda:0": healthy, "cuda:1": stuck, "cuda:2": healthy})
    assert {(o.host, o.computation) for o in odd} == {("cuda:1", n) for n in BF16_GEMMS}
    assert {o.host for o in judge("cls", "torch-2.13", {"cuda:0": healthy, "cuda:1": stuck})} == {"cuda:0", "cuda:1"}
    decided = judge("cls", "torch-2.13", {"cuda:0": healthy, "cuda:1": stuck, RECORDED: healthy})
    assert {o.host for o in decided} == {"cuda:1"}


@pytest.mark.amp_thorough  # two spawned processes importing torch: about 10 s
def test_an_audit_of_two_cpu_processes_on_disjoint_cores_agrees(capsys):
    assert main(["audit", "--processes", "2"]) == 0
    assert "AGREE" in capsys.readouterr().out
    assert main(["audit", "--processes", "999"]) == 2
