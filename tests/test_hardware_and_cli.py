"""Profile detection rules and the amp-harness command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.apps.cli import main
from harness.platform.hardware import CpuInfo, GpuInfo, ProfileError, cpu_profile_id, gpu_profile_id, validate_profile
from harness.storage import baselines as bl


@pytest.mark.parametrize(
    ("flags", "profile"),
    [
        (("avx2", "avx512f", "avx512_bf16", "amx_bf16"), "cpu-amxbf16"),
        (("avx2", "avx512f", "avx512_bf16"), "cpu-avx512bf16"),
        (("avx2", "avx512f"), "cpu-avx512"),
        (("avx2",), "cpu-avx2"),
        ((), "cpu-generic"),
    ],
)
def test_cpu_profile_follows_the_low_precision_flags(flags, profile):
    assert cpu_profile_id(CpuInfo("x", "x86_64", 2, flags)) == profile


@pytest.mark.parametrize(
    ("name", "cc", "profile"),
    [
        ("NVIDIA H200", "9.0", "nvidia-h200"),
        ("NVIDIA H100 80GB HBM3", "9.0", "nvidia-h100"),
        ("NVIDIA A100-SXM4-80GB", "8.0", "nvidia-a100"),
        ("NVIDIA GeForce RTX 4090", "8.9", "nvidia-sm89"),
    ],
)
def test_gpu_profile_from_name_or_capability(name, cc, profile):
    assert gpu_profile_id(GpuInfo(0, name, cc, 1, 1)) == profile
    assert validate_profile(profile) == profile


def test_validate_profile_rejects_unknown_ids_listing_known_ones():
    with pytest.raises(ProfileError, match=r"unknown hardware profile 'cpu-z80'\. Known profiles: .*nvidia-h200"):
        validate_profile("cpu-z80")


def test_cli_profile_prints_the_detected_profile(capsys):
    assert main(["profile"]) == 0
    assert "cpu profile:  cpu-" in capsys.readouterr().out
    assert main(["profile", "--json"]) == 0
    assert "cpu_profile" in json.loads(capsys.readouterr().out)


def test_cli_baselines_validates_files_and_fails_on_a_corrupt_one(tmp_path, capsys):
    store = bl.BaselineStore(tmp_path)
    path = store.path_for("s", "any", "n")
    store.queue_write(path, bl.BaselineDocument("s", "n", "any", "universal", {"x": 1}, {"torch": "2.13"}))
    store.flush()
    assert main(["baselines", "--baseline-dir", str(tmp_path)]) == 0
    (path.parent / "broken.json").write_text("{")
    assert main(["baselines", "--baseline-dir", str(tmp_path)]) == 1
    assert "BAD" in capsys.readouterr().out


def test_the_repository_baselines_are_all_valid():
    root = Path(__file__).resolve().parent.parent / "baselines"
    assert main(["baselines", "--baseline-dir", str(root)]) == 0


def test_console_script_is_installed():
    out = subprocess.run(
        [sys.executable, "-m", "harness.apps.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("amp-harness ")


def test_cli_report_summarises_the_latest_run_and_its_failures(tmp_path, capsys):
    from harness.storage import report as rp

    rows = [
        rp.make_row(
            run_id="r2",
            nodeid="n",
            suite="formats",
            check="c",
            metric="m",
            value=2.0,
            expected=1.0,
            allowance=0.5,
            outcome="fail",
        ).as_dict()
    ]
    rp.write(tmp_path, "r1", [], {"run_id": "r1"})
    rp.write(tmp_path, "r2", rows, {"profile": "cpu-avx2", "tests": {"failed": 1}})
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "run r2" in out and "profile cpu-avx2" in out
    assert "FAIL formats/c m=2.0 (expected 1.0, allowance 0.5)" in out
    assert main(["report", str(tmp_path / "missing")]) == 2
