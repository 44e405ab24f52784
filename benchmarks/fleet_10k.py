"""Benchmark: the dashboard and a diff over a fleet dataset of 10,000 runs of 500 metrics.

Builds the fleet (synthetic runs, written by harness.storage.fleet.publish's layout: 4 hardware
classes x 2 stacks x 25 days, 500 rows a run), then times, in this process:

* ``amp-harness dashboard --fleet DIR`` (index the fleet from its paths, load the latest runs of
  each class and stack, render, plots included);
* ``amp-harness diff --fleet DIR 'stack=torch-2.13,hardware_class=<c>' 'stack=torch-2.14,hardware_class=<c>'``;

and reports wall and CPU seconds and the peak resident memory. The issue's bound: both within 10 s
on 2 cores, in memory bounded by what is shown, not by the fleet.

    python benchmarks/fleet_10k.py [--runs 10000] [--metrics 500] [--dir DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from harness.apps.cli import main as cli
from harness.storage import fleet
from harness.storage import report as rp

CLASSES = (
    "cpu-amd-zen4-f25m17-avx512bf16-t2",
    "cpu-intel-f6m207-amx-t2",
    "cuda-nvidia-h200-sm90",
    "cuda-nvidia-a100-sm80",
)
STACKS = ("2.13.0+cpu", "2.14.1+cu130")
DAYS = 25


def build(root: Path, runs: int, metrics: int) -> None:
    """``runs`` runs spread evenly over classes, stacks and days, each ``metrics`` rows."""
    rng = np.random.default_rng(0)
    suites = np.array(["autocast", "formats", "training", "speed", "fp8"])
    # every column as the report writes it (one row made by the report itself, so a new column
    # reaches the benchmark without an edit here), then the values that vary per metric
    template = rp.make_row(
        run_id="",
        nodeid="",
        suite="",
        metric="",
        value=None,
        allowance=1.0,
        outcome=rp.Outcome.PASS,
        dtype="bfloat16",
        device="cpu",
        profile="cpu-avx512bf16",
        comparable=True,
    ).as_dict()
    base = {c: [template[c]] * metrics for c in rp.COLUMNS}
    base.update(
        nodeid=[f"suites/s/test_s.py::test_{i % 50}[cpu]" for i in range(metrics)],
        suite=list(suites[np.arange(metrics) % len(suites)]),
        check=[f"test_{i % 50}" for i in range(metrics)],
        metric=[f"m{i}.error_over_budget" for i in range(metrics)],
    )
    per_group = max(1, runs // (len(CLASSES) * len(STACKS)))
    n = 0
    for cls in CLASSES:
        for torch in STACKS:
            for k in range(per_group):
                if n >= runs:
                    return
                day = 1 + k * DAYS // per_group
                run_id = f"202611{day:02d}T{k % 24:02d}{k % 60:02d}00Z-{n:06x}"
                started = f"2026-11-{day:02d}T{k % 24:02d}:00:00+00:00"
                cols = dict(base)
                cols["run_id"] = [run_id] * metrics
                cols["value"] = (0.5 + 0.01 * rng.standard_normal(metrics)).tolist()
                cols["recorded_at"] = [started] * metrics
                meta = {
                    "run_id": run_id,
                    "started": started,
                    "primary_device": "cuda:0" if cls.startswith("cuda") else "cpu",
                    "fingerprint": {"torch_version": torch, "cpu_class": {"id": cls}, "cuda_class": {"id": cls}},
                    "schema_version": rp.SCHEMA_VERSION,
                }
                frame = pa.table({c: cols[c] for c in rp.COLUMNS})
                part = root / f"hardware_class={cls}" / f"stack={fleet.stack_of(meta)}" / f"date={started[:10]}"
                part.mkdir(parents=True, exist_ok=True)
                frame = frame.replace_schema_metadata({fleet.META_KEY: json.dumps(meta).encode()})
                pq.write_table(frame, part / f"{run_id}.parquet")
                n += 1


def timed(label: str, argv: list[str]) -> float:
    t0, c0 = time.perf_counter(), time.process_time()
    code = cli(argv)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"{label}: exit {code}, {wall:.2f} s wall, {cpu:.2f} s CPU")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--metrics", type=int, default=500)
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="amp-fleet-"))
    if not any(root.glob("hardware_class=*")):
        t = time.perf_counter()
        build(root, args.runs, args.metrics)
        print(f"built {args.runs} runs x {args.metrics} metrics in {time.perf_counter() - t:.0f} s: {root}")
    out = Path(tempfile.mkdtemp())
    dash = timed("dashboard", ["dashboard", "--fleet", str(root), "-o", str(out / "dashboard.html")])
    cls = CLASSES[0]
    d = timed(
        "diff",
        [
            "diff",
            "--fleet",
            str(root),
            f"stack=torch-2.13,hardware_class={cls}",
            f"stack=torch-2.14,hardware_class={cls}",
            "-o",
            str(out / "diff.txt"),
        ],
    )
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory {peak_mib:.0f} MiB; within 10 s: dashboard {dash <= 10}, diff {d <= 10}")
    if not args.keep and args.dir is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
