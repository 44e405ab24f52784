"""Error rates of the speed rule on this machine (docs/hardware-and-speed.md has the figures).

Calibrates this machine's hardware class (``amp-harness calibrate --compiled``) into a scratch
baseline dir, then runs the default tier's speed checks (``suites/speed`` and the compiled speed
case) RUNS times clean and RUNS times with the AMP path slowed DETECT_SLOWDOWN times, each run in a
fresh pytest process, and prints every case's verdicts. With ``--beside-suites`` a second process
runs ``pytest suites/`` over and over beside the measured runs (a shared CI runner's neighbour).

    python scripts/speed_rates.py [--runs 3] [--beside-suites] [--baseline-dir DIR]

About 2 minutes for the calibration and 40 s a run on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from harness.apps.cli import main as cli
from harness.domains.engines.bench import bench
from harness.storage import report as rp

REPO = Path(__file__).resolve().parent.parent
SLOWED_CONFTEST = f"""import pytest


@pytest.fixture
def _amp_slowdown() -> float:
    return {bench.DETECT_SLOWDOWN!r}
"""


def _suites(scratch: Path, slowdown: float) -> list[str]:
    """Copies of the speed checks in ``scratch``, their AMP path slowed ``slowdown`` times."""
    root = scratch / f"slowed-{slowdown}"
    if not root.exists():
        shutil.copytree(REPO / "suites" / "speed", root / "speed")
        shutil.copytree(REPO / "suites" / "compiled", root / "compiled")
        (root / "conftest.py").write_text(SLOWED_CONFTEST if slowdown != 1.0 else "", encoding="utf-8")
    return [str(root / "speed"), str(root / "compiled" / "test_compiled_speed.py")]


def _run(scratch: Path, baseline_dir: Path, slowdown: float, reports: Path) -> pd.DataFrame:
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--benchmark-disable"]
    args += [*_suites(scratch, slowdown), f"--amp-baseline-dir={baseline_dir}", f"--amp-report-dir={reports}"]
    subprocess.run(args, cwd=scratch, check=False, capture_output=True)
    [run] = rp.find_runs(reports)[-1:]
    rows = rp.load(run).rows
    return rows[rows.metric.str.endswith(".speedup")]


def _outcome(outcome: str, tags: str) -> str:
    """``noisy (busy)``: a NOISY verdict with the rule that abstained (the row's ``noisy_cause``)."""
    cause = json.loads(tags).get("noisy_cause") if outcome == "noisy" else None
    return f"{outcome} ({cause})" if cause else outcome


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--beside-suites", action="store_true", help="run `pytest suites/` beside, over and over")
    p.add_argument("--baseline-dir", type=Path, help="a calibrated baseline dir (default: calibrate one now)")
    args = p.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="speed-rates-"))
    baseline_dir = args.baseline_dir
    if baseline_dir is None:
        baseline_dir = scratch / "baselines"
        cli(["calibrate", "--compiled", "--baseline-dir", str(baseline_dir)])
    neighbour = None
    if args.beside_suites:
        loop = f"while true; do {sys.executable} -m pytest {REPO / 'suites'} -q -p no:cacheprovider -x >/dev/null 2>&1; done"
        neighbour = subprocess.Popen(["bash", "-c", loop], cwd=scratch, start_new_session=True)
    verdicts: dict[tuple[str, float], collections.Counter[str]] = collections.defaultdict(collections.Counter)
    try:
        for i in range(args.runs):
            for slowdown in (1.0, bench.DETECT_SLOWDOWN):
                rows = _run(scratch, baseline_dir, slowdown, scratch / f"reports-{slowdown}")
                outcomes = [_outcome(o, t) for o, t in zip(rows.outcome, rows.tags, strict=True)]
                for metric, outcome in zip(rows.metric, outcomes, strict=True):
                    verdicts[(metric.removesuffix(".speedup"), slowdown)][outcome] += 1
                print(
                    f"run {i + 1} slowed {slowdown}x: "
                    + ", ".join(f"{m} {o}" for m, o in zip(rows.metric, outcomes, strict=True)),
                    flush=True,
                )
    finally:
        if neighbour is not None:
            subprocess.run(["pkill", "-g", str(neighbour.pid)], check=False)
    print(f"\n| case | clean runs | AMP path {bench.DETECT_SLOWDOWN}x slower |\n|---|---|---|")
    for case in sorted({c for c, _ in verdicts}):
        cells = [
            ", ".join(f"{n} {o}" for o, n in sorted(verdicts[(case, s)].items())) for s in (1.0, bench.DETECT_SLOWDOWN)
        ]
        print(f"| {case} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
