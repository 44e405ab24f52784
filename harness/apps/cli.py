"""The ``amp-harness`` command: qualify a machine, calibrate its speed profile, and look at its baselines, reports and dashboards."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import __version__
from harness.storage import baselines as bl
from harness.storage import report as rp


def _cmd_profile(args: argparse.Namespace) -> int:
    from harness.storage.hardware import detect

    fp = detect()
    if args.json:
        print(json.dumps(fp.as_dict(), indent=2, default=str))
        return 0
    print(f"cpu profile:  {fp.cpu_profile}  ({fp.cpu.model}; flags: {' '.join(fp.cpu.flags) or 'none'})")
    print(f"cuda profile: {fp.cuda_profile or 'none (no CUDA device)'}")
    for g in fp.gpus:
        print(f"  cuda:{g.index} {g.name} sm{g.capability} {g.memory_bytes / 2**30:.1f} GiB")
    print(f"torch {fp.torch_version}, CUDA {fp.cuda_version}, cuDNN {fp.cudnn_version}, driver {fp.driver_version}")
    return 0


def _cmd_baselines(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    serializer = bl.Serializer()
    bad = 0
    from harness.storage import profiles

    files = sorted(p for p in root.rglob(f"*{bl.SUFFIX}") if not p.name.endswith(bl.OBTAINED_SUFFIX))
    for path in [p for p in files if p.parent.name == profiles.DIR]:
        try:
            prof = profiles.load(root, path.stem)
        except profiles.ProfileFileError as exc:
            bad += 1
            print(f"BAD  {exc}")
            continue
        judged = sum(t.expect == "judge" for t in prof.thresholds.values())
        print(f"ok   {path}  (profile: {judged} judged thresholds, {'judges' if prof.judge else 'records only'})")
    files = [p for p in files if p.parent.name != profiles.DIR]
    for path in files:
        try:
            doc = serializer.loads(path.read_text(encoding="utf-8"), path, "Regenerate it with pytest --amp-regen")
        except bl.BaselineError as exc:
            bad += 1
            print(f"BAD  {exc}")
            continue
        p = doc.provenance
        print(f"ok   {path}  ({p.get('created')}, torch {p.get('torch')}, {p.get('profile')})")
    leftovers = sorted(root.rglob(f"*{bl.OBTAINED_SUFFIX}"))
    for path in leftovers:
        print(f"note {path}: obtained values of a mismatch; compare with its baseline, then delete it")
    print(f"{len(files)} baselines, {bad} unreadable")
    return 1 if bad else 0


def _cmd_report(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if not path.exists():
        print(f"amp-harness: no such report or report directory: {path}", file=sys.stderr)
        return 2
    if (path / rp.ROWS_PARQUET).is_file() or path.is_file():
        runs = [path]
    else:
        runs = rp.find_runs(path)
        if not runs:
            print(f"no run reports under {path}", file=sys.stderr)
            return 2
        runs = runs[-1:]
    loaded = rp.load(runs[0])
    meta = loaded.meta
    print(f"run {meta.get('run_id')} ({meta.get('started')} .. {meta.get('finished')}), profile {meta.get('profile')}")
    print(f"tests: {meta.get('tests')}; rows: {len(loaded.rows)} by outcome {meta.get('row_outcomes')}")
    failed = loaded.rows[loaded.rows["outcome"] == "fail"]
    for _, r in failed.iterrows():
        print(
            f"  FAIL {r['suite']}/{r['check']} {r['metric']}={r['value']} (expected {r['expected']}, allowance {r['allowance']})"
        )
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from harness.apps import dashboard as db

    loaded = db.write_dashboard(args.reports, args.output, window=args.window)
    for problem in loaded.problems:
        print(f"warning: skipped {problem}", file=sys.stderr)
    print(f"dashboard: {len(loaded.runs)} runs, {len(loaded.rows)} rows -> {args.output}")
    return 0 if len(loaded.runs) else 2


def _cmd_compare(args: argparse.Namespace) -> int:
    import pandas as pd

    from harness.apps import dashboard as db

    a, b = rp.load(args.run_a), rp.load(args.run_b)
    table = db.compare(a.rows, b.rows)
    with pd.option_context("display.max_rows", None, "display.width", 200, "display.max_colwidth", 70):
        print(
            f"A: {a.meta.get('run_id')} ({a.meta.get('profile')})   B: {b.meta.get('run_id')} ({b.meta.get('profile')})"
        )
        print(table.to_string(index=False, float_format=lambda v: f"{v:.6g}", na_rep=""))
    flagged = int((table["flag"] != "").sum())
    print(f"{len(table)} shared metrics, {flagged} beyond their allowance")
    if args.csv:
        table.to_csv(args.csv, index=False)
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    import torch

    from harness.domains.speed import bench
    from harness.storage import profiles
    from harness.storage.hardware import detect
    from harness.storage.provenance import provenance

    fp = detect()
    device = torch.device(args.device)
    profile = args.profile or (fp.cuda_profile if device.type == "cuda" else fp.cpu_profile) or "generic"
    root = Path(args.baseline_dir)
    existing = profiles.load(root, profile)
    prof = profiles.Profile(
        profile,
        existing.description if profiles.path_for(root, profile).exists() else f"{profile} (calibrated)",
        judge=True,
        peak_flops=existing.peak_flops,
        peak_origin=existing.peak_origin,
    )
    for workload, dtype in profiles.DEFAULT_CASES:
        w = bench.WORKLOADS[workload]
        dt = getattr(torch, dtype)
        speedups = []
        for run in range(args.runs):
            t = bench.interleaved(w.make(device, None), w.make(device, dt), device, rounds=args.rounds)
            speedups.append(t.speedup)
            print(
                f"  {workload}/{dtype} run {run + 1}/{args.runs}: speedup {t.speedup:.3g} (IQR {t.spread:.3g})",
                flush=True,
            )
        prof.thresholds[f"{workload}/{dtype}"] = profiles.threshold_from_calibration(speedups)
    from harness.storage.provenance import git_commit

    prof.provenance = {
        **provenance(fp, device=str(device), profile=profile, commit=git_commit(Path.cwd())),
        "runs": args.runs,
        "rounds": args.rounds,
    }
    path = profiles.save(root, prof)
    print(f"profile {profile}: thresholds written to {path}")
    return 0


def _cmd_qualify(args: argparse.Namespace, rest: list[str]) -> int:
    from harness.apps import qualify

    required = [c for c, _ in qualify.CAPABILITIES if c not in args.optional]
    return qualify.run(rest, Path(args.report_dir), required)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="amp-harness", description=__doc__)
    parser.add_argument("--version", action="version", version=f"amp-harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("profile", help="detect this machine's hardware profile")
    p.add_argument("--json", action="store_true", help="print the whole fingerprint as JSON")
    p.set_defaults(func=_cmd_profile)
    b = sub.add_parser("baselines", help="validate every baseline file (format version, JSON, no NaN)")
    b.add_argument("--dir", default="baselines", help="baseline root (default: baselines)")
    b.set_defaults(func=_cmd_baselines)
    r = sub.add_parser("report", help="summarise a run report (a run directory, or the latest under a report dir)")
    r.add_argument("path", nargs="?", default="amp-reports")
    r.set_defaults(func=_cmd_report)
    d = sub.add_parser("dashboard", help="one self-contained HTML dashboard over many run reports")
    d.add_argument("reports", nargs="+", help="run directories, report directories or rows.parquet files")
    d.add_argument("-o", "--output", default="dashboard.html")
    d.add_argument("--window", type=int, default=5, help="previous runs whose median is the reference (default 5)")
    d.set_defaults(func=_cmd_dashboard)
    c = sub.add_parser("compare", help="two runs side by side: values, delta, allowance, flag")
    c.add_argument("run_a")
    c.add_argument("run_b")
    c.add_argument("--csv", help="also write the table as CSV")
    c.set_defaults(func=_cmd_compare)
    k = sub.add_parser("calibrate", help="measure AMP speedups here and write this profile's thresholds")
    k.add_argument("--profile", help="profile id (default: detected)")
    k.add_argument("--device", default="cpu")
    k.add_argument("--runs", type=int, default=5, help="independent measurements per workload (default 5)")
    k.add_argument("--rounds", type=int, default=7, help="interleaved rounds per measurement (default 7)")
    k.add_argument("--baseline-dir", default="baselines")
    k.set_defaults(func=_cmd_calibrate)
    q = sub.add_parser(
        "qualify", help="run the suites (extra arguments go to pytest) and print a verdict per capability"
    )
    q.add_argument("--report-dir", default="amp-reports", help="run report and JUnit XML go here (default amp-reports)")
    q.add_argument(
        "--optional",
        action="append",
        default=[],
        metavar="CAPABILITY",
        help="a capability whose FAIL/NOISY does not decide the exit status (repeatable), e.g. speed",
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "qualify":
        return _cmd_qualify(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return int(args.func(args))
    except rp.ReportError as exc:
        print(f"amp-harness: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
