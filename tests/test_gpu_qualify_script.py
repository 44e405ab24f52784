"""The prepared GPU qualification script, dry-run on the CPU with a narrow selection: it installs
nothing over the host's torch (SKIP_INSTALL here), calibrates, runs the suites, writes candidate
baselines and packs everything into one archive, printing progress."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers import REPO

SCRIPT = REPO / "scripts" / "gpu-qualify.sh"


def test_the_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_the_help_states_the_budget_and_the_resume():
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, check=True).stdout
    assert "Budget: 8 minutes on one H100 or" in out and "BUDGET_S" in out
    assert "Resume: a run cut short" in out and "3 cut at the budget" in out


@pytest.mark.amp_thorough  # five interpreters that import torch, about 12 s on 2 cores; what it composes
@pytest.mark.standalone_scripts  # (profile, calibrate, qualify) is tested piece by piece in the default tier
def test_a_cpu_dry_run_packs_baselines_report_junit_and_log(tmp_path):
    env = {
        **os.environ,
        "AMP_DEVICE": "cpu",
        "SKIP_INSTALL": "1",
        "CALIBRATION_RUNS": "1",
        "CALIBRATION_CASES": "matmul_256/float16",
        "PYTEST_ARGS": "-k test_format_limits",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]  # other capabilities did not run
    assert "[gpu-qualify +" in proc.stdout and "qualification verdict" in proc.stdout
    [archive] = out.glob("gpu-qualify-*.tar.gz")
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "gpu-qualify.log" in names and "fingerprint.json" in names
    assert any(n.startswith("baselines/profiles/cpu-") for n in names)  # the calibrated class
    assert any(n.endswith("junit-qualify.xml") for n in names) and any(n.endswith("rows.parquet") for n in names)
    # run again: every stage is kept, nothing is measured again, the verdict is the same
    again = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert again.returncode == 2, again.stdout[-3000:] + again.stderr[-2000:]
    for stage in ("baselines", "calibrate", "suites"):
        assert f"stage {stage}: done in an earlier part" in again.stdout, again.stdout[-3000:]
    assert "amp-harness calibrate" not in again.stdout.split("resuming", 1)[1]
