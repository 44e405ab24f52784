"""Every script and benchmark keeps a real command line and runs at a smoke size, so that the next
change of a schema or of a domain API cannot break one unseen (benchmarks/fleet_10k.py once failed
at once on the report's new column). One interpreter runs them all, through runpy, as
``python SCRIPT ARGS`` would: they share its imports (torch once, not once a script)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

SCRIPTS = sorted([*(REPO / "scripts").glob("*.py"), *(REPO / "benchmarks").glob("*.py")])

#: Smoke sizes: the smallest arguments that still take every path of the script (seconds on 2
#: cores in the comment). The default tier runs the report-schema and specification readers, whose
#: inputs change with the harness's own schemas; the training-rate scripts, which train at any size,
#: run in the thorough tier (each still answers --help in the default one).
SMOKE = {
    "fleet_10k.py": ["--runs", "16", "--metrics", "5"],  # 3 s
    "block_linear_rates.py": ["1"],  # 2 s
}
THOROUGH = {
    "fp8_training_rates.py": ["1"],  # 6 s
    "measure_lane_rates.py": ["mlp", "--seeds", "2", "--recipes", "bf16"],  # 4 s
    "block_training_rates.py": ["1"],  # 8 s: six fp32 runs and nine block-scaled ones
    "block_lane_rates.py": ["1", "mlp", "1"],  # 25 s: a lane per fault and noise level
    "speed_rates.py": ["--runs", "1"],  # minutes: a calibration and pytest runs
    "burn_in_rates.py": ["--runs", "1", "--minutes", "0.01", "--trials", "1", "--short", "0.01"],  # 5 s
    "replay_audit_rates.py": ["--steps", "2"],  # 10 s: seven launches of gloo ranks
}

DRIVER = """
import contextlib, io, json, runpy, sys
codes = {}
for item in json.loads(sys.argv[1]):
    path, args = item
    sys.argv = [path, *args]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        codes[path] = [0, out.getvalue()[-400:]]
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
        codes[path] = [code, out.getvalue()[-400:]]
    except Exception as exc:
        codes[path] = [1, f"{type(exc).__name__}: {exc}"]
print("CODES " + json.dumps(codes))
"""


def _run(items: list[tuple[str, list[str]]]) -> dict[str, tuple[int, str]]:
    out = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(items)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
        check=False,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("CODES ")), None)
    assert line is not None, out.stdout[-3000:] + out.stderr[-3000:]
    return {k: (v[0], v[1]) for k, v in json.loads(line.removeprefix("CODES ")).items()}


def test_there_are_scripts_and_each_has_a_size():
    names = {p.name for p in SCRIPTS}
    assert names, "no scripts found"
    assert names == set(SMOKE) | set(THOROUGH), "give every script a smoke size here"


def test_every_script_answers_help():
    codes = _run([(str(p), ["--help"]) for p in SCRIPTS])
    bad = {k: v for k, v in codes.items() if v[0] != 0 or "show this help message" not in v[1]}
    assert not bad, bad


def test_the_gpu_qualification_script_answers_help_without_running(tmp_path):
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu-qualify.sh"), "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0 and "AMP_DEVICE" in out.stdout
    assert not any(tmp_path.iterdir()), "--help created files"


@pytest.mark.standalone_scripts
@pytest.mark.amp_thorough  # one interpreter runs every script at its smoke size, one after another
def test_every_script_runs_at_its_smoke_size():
    codes = _run([(str(REPO / ("benchmarks" if n == "fleet_10k.py" else "scripts") / n), a) for n, a in SMOKE.items()])
    bad = {k: v for k, v in codes.items() if v[0] != 0}
    assert not bad, bad


@pytest.mark.amp_thorough
def test_the_heavy_scripts_run_at_their_smoke_size():
    codes = _run([(str(REPO / "scripts" / n), a) for n, a in THOROUGH.items()])
    bad = {k: v for k, v in codes.items() if v[0] != 0}
    assert not bad, bad
