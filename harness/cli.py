"""The ``amp-harness`` command: look at the machine, the baselines and the run reports."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from harness import __version__
from harness import baseline as bl
from harness import report as rp


def _cmd_profile(args: argparse.Namespace) -> int:
    from harness.hardware import detect

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
    files = sorted(p for p in root.rglob(f"*{bl.SUFFIX}") if not p.name.endswith(bl.OBTAINED_SUFFIX))
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
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except rp.ReportError as exc:
        print(f"amp-harness: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
