"""Speed thresholds bite (a 1.3x slower AMP path fails, clean runs do not), the noise gate, the
calibration rules, profiles, and the qualification verdict."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import INNER_ARGS, REPO, inject

from harness.apps import qualify
from harness.domains.speed import bench
from harness.storage import profiles
from harness.storage.hardware import detect

PROFILE = detect().cpu_profile
PROFILE_FILE = profiles.path_for(REPO / "baselines", PROFILE)
needs_calibration = pytest.mark.skipif(
    not PROFILE_FILE.exists() or not profiles.load(REPO / "baselines", PROFILE).judge,
    reason=f"no calibrated thresholds for this machine's profile {PROFILE}: run `amp-harness calibrate` on it",
)
GATE = "matmul_1024-bfloat16"


def _speed_suite(pytester: pytest.Pytester, suite_copy, slowdown: float) -> None:
    suite_copy("speed/test_amp_speed.py", conftest=False)
    (pytester.path / "baselines" / "profiles").mkdir(parents=True)
    shutil.copy(PROFILE_FILE, pytester.path / "baselines" / "profiles")
    inject(pytester, "speed", f"import pytest\n\n@pytest.fixture\ndef amp_slowdown():\n    return {slowdown}\n")


@needs_calibration
def test_an_amp_path_made_1_3x_slower_fails_the_speed_threshold(pytester, suite_copy):
    _speed_suite(pytester, suite_copy, bench.DETECT_SLOWDOWN)
    result = pytester.runpytest(*INNER_ARGS, "-k", GATE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*matmul_1024/bfloat16: AMP speedup *x is below the {PROFILE} threshold *x*"], consecutive=False
    )


@needs_calibration
def test_five_clean_runs_in_a_row_do_not_fail(pytester, suite_copy):
    _speed_suite(pytester, suite_copy, 1.0)
    for run in range(5):
        result = pytester.runpytest(*INNER_ARGS, "-k", "meets_the_profile_threshold")
        outcomes = result.parseoutcomes()
        assert outcomes.get("failed", 0) == 0, f"clean run {run + 1} failed:\n{result.stdout.str()[-3000:]}"


def test_noise_gate_marks_a_spread_that_straddles_the_threshold():
    steady = bench.Timing((1.0,) * 7, (0.25,) * 7)  # speedup 4 exactly
    assert steady.speedup == 4.0 and steady.spread == 0.0
    assert not bench.is_noisy(steady, 3.5)
    wobbly = bench.Timing((1.0,) * 7, (0.2, 0.33, 0.25, 0.4, 0.22, 0.3, 0.27))
    assert bench.is_noisy(wobbly, 3.5)
    assert not bench.is_noisy(wobbly, None)


def test_calibration_rules():
    judged = profiles.threshold_from_calibration([4.0, 4.1, 4.05, 4.1, 4.0])
    assert judged.expect == "judge" and 4.05 / bench.DETECT_SLOWDOWN < judged.min_speedup < 4.0
    assert profiles.threshold_from_calibration([0.02, 0.021, 0.02]).expect == "slower"
    assert profiles.threshold_from_calibration([4.0, 2.0, 4.2]).expect == "record"


def test_published_gpu_profiles_carry_peaks_and_provisional_thresholds():
    for pid in ("nvidia-a100", "nvidia-h100", "nvidia-h200"):
        prof = profiles.load(REPO / "baselines", pid)
        assert prof.peak_flops["bfloat16"] and "datasheet" in prof.peak_origin
        assert all(t.provisional and t.min_speedup is None for t in prof.thresholds.values())
    assert not profiles.load(REPO / "baselines", "generic").judge
    assert not profiles.load(REPO / "baselines", "nvidia-sm120").judge  # no file: recorded, not judged


def test_a_corrupt_profile_file_is_a_clear_error(tmp_path):
    path = profiles.path_for(tmp_path, "cpu-avx2")
    path.parent.mkdir(parents=True)
    path.write_text("{")
    with pytest.raises(profiles.ProfileFileError, match=r"cpu-avx2.json is corrupt .*amp-harness calibrate"):
        profiles.load(tmp_path, "cpu-avx2")


JUNIT = """<?xml version="1.0"?><testsuites><testsuite>
<testcase classname="suites.formats.test_a" name="test_x"/>
<testcase classname="suites.speed.test_amp_speed" name="test_y"><skipped message="NOISY: matmul straddles"/></testcase>
<testcase classname="suites.memory.test_memory" name="test_z"><failure message="no activation saving"/></testcase>
</testsuite></testsuites>"""


def test_verdicts_and_exit_status(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    vs = {v.capability: v for v in qualify.verdicts(junit)}
    assert vs["formats"].status == "PASS"
    assert vs["speed"].status == "NOISY" and "straddles" in vs["speed"].reason
    assert vs["memory"].status == "FAIL" and "no activation saving" in vs["memory"].reason
    assert vs["loss scaling"].status == "SKIPPED"
    assert qualify.exit_status(list(vs.values()), ["formats", "memory"]) == 1
    assert qualify.exit_status(list(vs.values()), ["formats", "speed"]) == 2
    assert qualify.exit_status(list(vs.values()), ["formats"]) == 0


def test_qualify_runs_the_suites_and_prints_the_verdict(tmp_path, capfd):
    from harness.apps.cli import main

    code = main(
        [
            "qualify",
            "--report-dir",
            str(tmp_path),
            str(REPO / "suites/formats/test_format_limits.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={REPO}",
        ]
    )
    out = capfd.readouterr().out
    assert "qualification verdict" in out and "formats" in out
    assert code == 2  # the other capabilities did not run
    assert "NOT QUALIFIED: a required capability is noisy or did not run" in out
    assert (tmp_path / "junit-qualify.xml").exists()
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert (run / "verdict.json").exists()
    optional = [a for c, _ in qualify.CAPABILITIES if c != "formats" for a in ("--optional", c)]
    assert (
        main(
            [
                "qualify",
                "--report-dir",
                str(tmp_path / "2"),
                *optional,
                str(REPO / "suites/formats/test_format_limits.py"),
                "-q",
                "-p",
                "no:cacheprovider",
                f"--rootdir={REPO}",
            ]
        )
        == 0
    )


def test_the_example_ci_workflow_runs_qualify():
    text = (REPO / "examples" / "ci" / "qualify-gpu.yml").read_text()
    assert "amp-harness qualify" in text and "self-hosted" in text
    assert Path(REPO / "examples" / "ci" / "qualify-gpu.yml").exists()
