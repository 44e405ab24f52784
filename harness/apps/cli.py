"""The ``amp-harness`` command: qualify a machine, calibrate its speed profile, and look at its baselines, reports and dashboards."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from harness import __version__
from harness.apps import diff as df
from harness.apps import qualify
from harness.apps import release as rel
from harness.numerics.verdict import Outcome
from harness.platform.hardware import KERNEL_SETS, cpu_class, detect, kernel_set, uncapped_cpu
from harness.storage import atomic, fleet
from harness.storage import journal as jr
from harness.storage import report as rp
from harness.storage.provenance import git_commit, provenance

if TYPE_CHECKING:  # the CLI imports torch only in the commands that use it
    import torch


def _cmd_profile(args: argparse.Namespace) -> int:
    from harness.storage import profiles  # lazy: imports torch

    fp = detect()
    if args.json:
        print(json.dumps(fp.as_dict(), indent=2, default=str))
        return 0
    root = Path(args.baseline_dir)
    print(f"cpu profile:  {fp.cpu_profile}  ({fp.cpu.model}; flags: {' '.join(fp.cpu.flags) or 'none'})")
    classes = [("cpu", fp.cpu_class)] + [(f"cuda:{g.index}", fp.class_for(f"cuda:{g.index}")) for g in fp.gpus]
    for device, hc in classes:
        state = "calibrated" if profiles.path_for(root, hc.id).exists() else "NOT calibrated"
        print(f"{device} hardware class: {hc.id}  ({state} in {root / profiles.DIR})")
        print(f"  derived from: {hc.describe()}")
    print(f"cuda profile: {fp.cuda_profile or 'none (no CUDA device)'}")
    for g in fp.gpus:
        print(f"  cuda:{g.index} {g.name} sm{g.capability} {g.memory_bytes / 2**30:.1f} GiB")
    print(f"torch {fp.torch_version}, CUDA {fp.cuda_version}, cuDNN {fp.cudnn_version}, driver {fp.driver_version}")
    return 0


def _cmd_baselines(args: argparse.Namespace) -> int:
    from harness.storage.inventory import validate_tree  # lazy: imports torch

    report = validate_tree(Path(args.baseline_dir))
    for line in report.lines:
        print(line)
    print(f"{report.baselines} baselines, {report.profiles} hardware-class profiles, {report.bad} unreadable")
    return 1 if report.bad else 0


def _cmd_recover(paths: Sequence[str]) -> int:
    """``amp-harness report recover [DIR ...]``: the reports of dead sessions' journals."""
    found = 0
    for root in map(Path, paths or ["amp-reports"]):
        if root.name.startswith(jr.PREFIX):
            dirs = [root]
        elif root.is_dir():
            dirs = [d for d in root.glob(f"{jr.PREFIX}*") if d.is_dir()]
        else:
            print(f"amp-harness: no such report directory or journal: {root}", file=sys.stderr)
            return 2
        for d in sorted(dirs):
            found += 1
            try:
                report = jr.recover(d, how="recovered from its journal by amp-harness report recover")
            except (jr.JournalError, OSError, ValueError) as exc:
                print(f"amp-harness: {exc}", file=sys.stderr)
                continue
            print(f"recovered {d.name} -> {report}")
            for line in jr.describe(report):
                print(line)
    if not found:
        print("no journals of interrupted runs: nothing to recover")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    if args.path[:1] == ["recover"]:
        return _cmd_recover(args.path[1:])
    if len(args.path) > 1:
        raise _UsageError(f"report takes one run or report directory, or 'recover [DIR ...]'; got {args.path}")
    path = Path(args.path[0] if args.path else "amp-reports")
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
    interrupted = meta.get("interrupted")
    if interrupted:
        print(f"INTERRUPTED: the session died; {interrupted.get('how')} at {interrupted.get('recovered_at')}")
    for t in meta.get("test_results") or []:
        if Outcome.parse(str(t.get("verdict", "pass"))).broke:
            print(f"  {Outcome.parse(str(t['verdict'])).label} {t['nodeid']}: {t.get('message')}")
    failed = loaded.rows[loaded.rows["outcome"] == Outcome.FAIL.value]
    for _, r in failed.iterrows():
        print(
            f"  FAIL {r['suite']}/{r['check']} {r['metric']}={r['value']} (expected {r['expected']}, allowance {r['allowance']})"
        )
    return 0


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from harness.apps import dashboard as db  # lazy: imports pandas

    if not args.reports and not args.fleet:
        print("amp-harness dashboard: name run or report directories, or --fleet DIR", file=sys.stderr)
        return 2
    try:
        loaded = db.write_dashboard(args.reports, args.output, fleet=args.fleet, window=args.window)
    except (FileNotFoundError, fleet.FleetLocationError) as e:
        print(f"amp-harness dashboard: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the store could not be read (pyarrow's S3/GCS errors are OSError)
        print(f"amp-harness dashboard: {fleet.shown(args.fleet or '')}: {fleet.shown(str(e))}", file=sys.stderr)
        return 2
    for problem in loaded.problems:
        print(f"warning: skipped {problem}", file=sys.stderr)
    print(f"dashboard: {len(loaded.runs)} runs, {len(loaded.rows)} rows -> {args.output}")
    return 0 if len(loaded.runs) else 2


def _cmd_publish(args: argparse.Namespace) -> int:

    published, problems = 0, 0
    for path in map(Path, args.runs):
        dirs = [path] if (path / rp.ROWS_PARQUET).is_file() else (rp.find_runs(path) if path.is_dir() else [])
        if not dirs:
            print(f"amp-harness publish: {path}: no run report here", file=sys.stderr)
            problems += 1
        for d in dirs:
            try:
                print(f"{d} -> {fleet.publish(rp.load(d), args.fleet)}")
                published += 1
            except rp.ReportError as e:
                print(f"amp-harness publish: skipped {e}", file=sys.stderr)
                problems += 1
            except fleet.FleetLocationError as e:
                print(f"amp-harness publish: {e}", file=sys.stderr)
                return 2
            except OSError as e:  # the store refused or could not be reached (pyarrow's S3/GCS errors are OSError)
                print(
                    f"amp-harness publish: {d} not published to {fleet.shown(args.fleet)}: {fleet.shown(str(e))}",
                    file=sys.stderr,
                )
                problems += 1
    return 0 if published and not problems else 2


def _cmd_diff(args: argparse.Namespace) -> int:

    try:
        if args.fleet:
            a, b = df.fleet_side("A", args.fleet, args.run_a), df.fleet_side("B", args.fleet, args.run_b)
        else:
            a, b = df.load_side("A", args.run_a), df.load_side("B", args.run_b)
    except df.DiffInputError as e:
        print(f"amp-harness diff: {e}", file=sys.stderr)
        return 2
    result = df.diff(a, b)
    text = df.RENDERERS[args.format](result)
    if args.output:
        atomic.write_text(Path(args.output), text)
        print(f"{result.summary()} -> {args.output}")
    else:
        sys.stdout.write(text)
    if args.csv:
        atomic.write_text(Path(args.csv), df.render_csv(result))
    return 1 if result.regressed else 0


def _cmd_release(args: argparse.Namespace, pytest_args: Sequence[str] = ()) -> int:
    if args.candidate is None and not args.requirement:
        raise _UsageError("release: give the torch requirement (torch==2.15.0), or --candidate RUN")
    project, reports = Path.cwd(), Path(args.report_dir)
    try:
        if args.candidate is not None:
            candidate_run = Path(args.candidate)
        else:
            print(f"amp-harness release: building {args.env} with {args.requirement} {' '.join(args.extra)}".rstrip())
            python = rel.build_environment(Path(args.env), [args.requirement, *args.extra], project)
            print(f"amp-harness release: pytest suites/ with {python}")
            candidate_run = rel.run_suites(python, project, reports / "candidate", list(pytest_args))
        if args.reference is not None:
            reference_run = Path(args.reference)
        else:
            print(f"amp-harness release: pytest suites/ here ({sys.executable})")
            reference_run = rel.run_suites(rel.here(), project, reports / "reference", list(pytest_args))
        report = rel.release_report(df.load_side("A", reference_run), df.load_side("B", candidate_run))
    except (rel.ReleaseError, df.DiffInputError) as e:
        print(f"amp-harness release: {e}", file=sys.stderr)
        return 2
    text = rel.render(report)
    sys.stdout.write(text)
    if args.output:
        atomic.write_text(Path(args.output), text)
    return report.exit_code


def _calibrate_allreduce(args: argparse.Namespace) -> int:
    """The all-reduce floors of the world the ranks run on (spawned, or the launched one under
    torchrun: rank 0 writes), in the profile of the class whose interconnect they cross."""
    from harness.domains.engines.ranks import ranks  # lazy: imports torch
    from harness.domains.engines.ranks import world as W  # lazy: beside ranks, used only here
    from harness.domains.speed import interconnect as I  # lazy: imports torch
    from harness.storage import profiles  # lazy: imports torch

    launched = W.launched()
    speaks = launched is None or launched.rank == 0  # rank 0 alone reports and writes
    runs = []
    for i in range(args.runs):
        runs.append(I.from_ranks(ranks.launch(I.RANK_PROGRAM, world=args.world, dtypes=list(I.DTYPES))))
        shown = ", ".join(f"{d} {g:.3g}" for d, g in runs[-1].gbps.items() if g is not None)
        if speaks:
            print(f"  all-reduce run {i + 1}/{args.runs} on {runs[-1].case}: {shown} GB/s", flush=True)
    if not speaks:
        return 0
    fp = detect()
    device = "cuda:0" if runs[0].backend == "nccl" else "cpu"
    hc = fp.class_for(device)
    root = Path(args.baseline_dir)
    existing = profiles.load(root, hc.id, (fp.cuda_profile if device != "cpu" else fp.cpu_profile) or "")
    prof = profiles.Profile(
        hc.id,
        f"{hc.id}: calibrated by amp-harness calibrate",
        calibrated=True,
        peak_flops=existing.peak_flops,
        peak_origin=existing.peak_origin,
        thresholds=dict(existing.thresholds),
        provenance=dict(existing.provenance),
        derived_from=hc.derived_from,
    )
    for dtype in I.DTYPES:
        values = [g for m in runs if (g := m.gbps.get(dtype)) is not None]
        if not values:
            print(f"  {runs[0].case}/{dtype}: not calibrated: {runs[0].errors.get(dtype, 'not measured')}")
            continue
        prof.thresholds[f"{runs[0].case}/{dtype}"] = threshold = I.floor_from_calibration(values)
        print(f"  -> {runs[0].case}/{dtype}: {threshold.origin}")
    prof.provenance["allreduce"] = {
        **provenance(fp, device=device, profile=hc.id, commit=git_commit(Path.cwd())),
        "runs": args.runs,
        "world": runs[0].world,
        "hosts": runs[0].hosts,
        "backend": runs[0].backend,
        "nbytes": runs[0].nbytes,
    }
    path = profiles.save(root, prof)
    print(f"hardware class {hc.id}: all-reduce floors written to {path}; review and commit it with your baselines")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    if args.allreduce:
        return _calibrate_allreduce(args)
    import torch

    from harness.domains.compiled import speed as compiled_speed  # lazy: imports torch
    from harness.domains.engines.bench import bench, sizing  # lazy: imports torch
    from harness.domains.fp8 import speed as fp8_speed  # lazy: imports torch
    from harness.domains.speed import calibration, thresholds  # lazy: imports torch
    from harness.domains.speed.workloads import WORKLOADS  # lazy: imports torch
    from harness.storage import profiles  # lazy: imports torch

    if args.rounds is not None and args.rounds < bench.MIN_ROUNDS:
        print(
            f"amp-harness calibrate: --rounds {args.rounds} is fewer than {bench.MIN_ROUNDS}, the fewest rounds "
            f"whose speedup has a {bench.CONFIDENCE:.0%} interval: no case could be judged; give at least "
            f"{bench.MIN_ROUNDS}, or leave --rounds out (adaptive)",
            file=sys.stderr,
        )
        return 2
    fp = detect()
    device = torch.device(args.device)
    hc = fp.class_for(str(device))
    profile_id = fp.cuda_profile if device.type == "cuda" else fp.cpu_profile
    root = Path(args.baseline_dir)
    workloads = {**WORKLOADS, **compiled_speed.workloads("inductor"), **fp8_speed.WORKLOADS}
    known_cases = (
        *thresholds.DEFAULT_CASES,
        *thresholds.GPU_CASES,
        *compiled_speed.DEFAULT_CASES,
        *compiled_speed.THOROUGH_CASES,
        *fp8_speed.CASES,
    )
    gpu_cases = thresholds.GPU_CASES if device.type == "cuda" else ()
    cases = (*thresholds.DEFAULT_CASES, *gpu_cases, *(compiled_speed.CALIBRATED_CASES if args.compiled else ()))
    if args.cases:
        wanted = [tuple(c.split("/", 1)) for c in args.cases]
        unknown = [("/".join(c)) for c in wanted if c not in known_cases]
        if unknown:
            print(
                f"amp-harness calibrate: unknown case(s) {', '.join(unknown)}; "
                f"choose from {', '.join(w + '/' + d for w, d in known_cases)}",
                file=sys.stderr,
            )
            return 2
        cases = tuple((w, d) for w, d in wanted)
    existing = profiles.load(root, hc.id, profile_id or "")
    floor = sizing.launch_floor(device)
    prof = profiles.Profile(
        hc.id,
        f"{hc.id}: calibrated by amp-harness calibrate",
        calibrated=True,
        peak_flops=existing.peak_flops,
        peak_origin=existing.peak_origin,
        thresholds=dict(existing.thresholds),
        derived_from=hc.derived_from,
        launch_floor_s=floor,
    )
    print(f"calibrating hardware class {hc.id} ({hc.describe()})", flush=True)
    print(f"  launch floor: {floor * 1e6:.3g} us a trivial kernel, launched and synchronised", flush=True)
    same_torch = existing.provenance.get("torch") == fp.torch_version
    results = calibration.calibrate(
        cases,
        workloads,
        device,
        runs=args.runs,
        rounds=args.rounds,
        stored=existing.thresholds if same_torch else {},
        log=lambda line: print(line, flush=True),
        hardware_class=hc.id,
        launch_floor_s=floor,
    )
    for result in results:
        prof.thresholds["/".join(result.case)] = result.threshold
        print(f"  -> {result.said}")
    prof.provenance = {
        **provenance(fp, device=str(device), profile=hc.id, commit=git_commit(Path.cwd())),
        "runs": args.runs,
        "rounds": args.rounds or "adaptive",
        "clock": bench.clock_of(device),
    }
    path = profiles.save(root, prof)
    print(f"hardware class {hc.id}: thresholds written to {path}; review and commit it with your baselines")
    if args.cases or device.type != "cpu":  # a GPU's interconnect is calibrated on its own world: --allreduce
        return 0
    # every speed check of this class calibrated by one command: the all-reduce floors of spawned
    # ranks too (a timing of the speed capability); ranks that cannot run here leave them uncalibrated
    from harness.domains.engines.ranks.ranks import RankError  # lazy: imports torch

    try:
        return _calibrate_allreduce(args)
    except RankError as exc:
        print(f"  all-reduce floors not calibrated: the ranks did not run here: {str(exc).splitlines()[0]}")
        return 0


def _cmd_kernels(args: argparse.Namespace, rest: list[str]) -> int:
    """List the kernel sets, or run a command under one (its caps and an Inductor cache of its own:
    Inductor's cache ignores the caps, and a kernel compiled for wider ISA crashes under them)."""
    import os
    import subprocess
    import tempfile

    cpu = uncapped_cpu()
    threads = os.cpu_count() or 1
    if args.name is None:
        for each in KERNEL_SETS.values():
            here = cpu_class(each.on(cpu), threads).id
            print(f"{each.name:12} {each.kind}\n{'':12} {each.assignments}; here: {here}")
        return 0
    ks = KERNEL_SETS.get(args.name)
    if ks is None:
        raise _UsageError(f"unknown kernel set {args.name!r}; choose from {', '.join(KERNEL_SETS)}")
    if not rest:
        raise _UsageError(f"name the command to run after --: amp-harness kernels {ks.name} -- pytest suites/")
    cache = Path(tempfile.gettempdir()) / f"amp-harness-inductor-{ks.name}"
    env = {**os.environ, **ks.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    on = ks.on(cpu)
    print(f"kernel set {ks.name}: {ks.kind}\n  {ks.assignments} TORCHINDUCTOR_CACHE_DIR={cache}", flush=True)
    print(f"  runs as {kernel_set(on)}; hardware class {cpu_class(on, threads).id}", flush=True)
    lacking = ks.shortfall(cpu)
    if lacking:
        print(f"  this CPU lacks {' '.join(lacking)}: a cap cannot add them, its own lower kernels run", flush=True)
    return int(subprocess.run(rest, env=env, check=False).returncode)


def _positive_int(text: str) -> int:
    """argparse type: an integer of at least 1 (0 runs or rounds would calibrate nothing)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is not a positive integer")
    return n


def _capability_list(values: Sequence[str], option: str) -> list[str]:
    """``--optional speed,memory --optional numerics`` -> names, each checked."""

    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    unknown = [n for n in names if n not in qualify.CAPABILITIES]
    if unknown:
        raise _UsageError(
            f"{option} {', '.join(unknown)}: not a capability; choose from {', '.join(qualify.CAPABILITIES)}"
        )
    return names


def _cmd_repro(args: argparse.Namespace) -> int:
    """Standalone reproductions of the registered known issues (torch, and torchao, only)."""
    import contextlib
    import datetime
    import importlib.metadata
    import platform

    from harness.domains import known_issues as R  # lazy: imports torch

    if args.report is not None:
        if args.known or args.list:
            raise _UsageError("--report writes the failed checks of a run; --known and --list are about known issues")
        return _repro_failed_checks(Path(args.report), args.check, Path(args.output))
    if args.check:
        raise _UsageError("--check selects failed checks of a run report: give the report with --report")
    if args.list:
        for issue_id, (where, issue) in sorted(R.REGISTRIES.items()):
            print(f"{issue_id}  ({issue.package} {issue.span}; {where})")
        return 0
    unknown = [i for i in args.known if i not in R.REPRODUCTIONS]
    if unknown:
        raise _UsageError(f"no known issue {', '.join(unknown)}; known: {', '.join(sorted(R.REPRODUCTIONS))}")
    import torch

    versions = [f"torch {torch.__version__}"]
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        versions.append(f"torchao {importlib.metadata.version('torchao')}")
    provenance = (
        f"{', '.join(versions)}, python {platform.python_version()}, {detect().cpu_class.id}, amp-harness "
        f"{__version__}, {datetime.date.today().isoformat()}"
    )
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for issue_id in args.known or sorted(R.REPRODUCTIONS):
        path = out / f"{issue_id.replace('-', '_')}.py"
        atomic.write_text(path, R.script(issue_id, provenance))
        print(path)
    return 0


def _unique_stem(metric: str, dtype: str, used: set[str]) -> str:
    """A script's file name from its row: the metric, then its dtype where another failed row of the
    run has that metric (bf16 and fp16 of one check), then a count; recorded in ``used``."""

    def clean(text: str) -> str:
        return "".join(c if c.isalnum() else "_" for c in text)[:60].strip("_")

    stem = clean(metric) or "check"
    candidates = [stem, *([f"{stem}_{clean(dtype.removeprefix('torch.'))}"] if dtype else [])]
    candidates += [f"{stem}_{n}" for n in range(2, len(used) + 3)]
    chosen = next(c for c in candidates if c not in used)
    used.add(chosen)
    return chosen


def _repro_failed_checks(report: Path, selected: list[str], out: Path) -> int:
    """A script per failed check of the run at ``report`` (a run directory, or a report directory:
    its newest run) whose node id or row name contains one of ``selected`` (none: every failed
    check). Exit 0 when each has its script, 3 when some recorded none (each named, with the
    command that reruns it), 4 when nothing failed there or nothing matched."""
    from harness.domains import known_issues as R  # lazy: imports torch
    from harness.domains import repro as FR  # lazy: imports torch

    if not report.exists():
        raise _UsageError(f"--report {report}: no such run report directory")
    try:
        run_dir = rp.newest_run(report)
        loaded = rp.load(run_dir)
    except rp.ReportError as exc:
        raise _UsageError(f"--report {exc}") from None
    # each row with its tags, parsed once
    every = [(r, json.loads(str(r.get("tags") or "{}"))) for r in rp.records(loaded.rows)]
    failed_tests = {str(r["nodeid"]) for r, _ in every if r["outcome"] == Outcome.FAIL.value}
    failed_tests |= {str(t["nodeid"]) for t in rp.records(loaded.tests) if t.get("result") in ("failed", "error")}
    # a failed row, and a diagnosis row of a failed test that kept a reproduction (the first op of a
    # training step over its budget); a failed row whose test has such a row is reproduced by it
    kept = {str(r["nodeid"]) for r, tags in every if "repro" in tags and str(r["nodeid"]) in failed_tests}
    rows = [
        (r, tags)
        for r, tags in every
        if (r["outcome"] == Outcome.FAIL.value and ("repro" in tags or str(r["nodeid"]) not in kept))
        or ("repro" in tags and str(r["nodeid"]) in failed_tests)
    ]
    if selected:
        rows = [(r, t) for r, t in rows if any(s in str(r["nodeid"]) or s in str(r["metric"]) for s in selected)]
    if not rows:
        what = f" matching {', '.join(selected)}" if selected else ""
        print(f"no failed check{what} in the run {run_dir}: nothing to reproduce", file=sys.stderr)
        return 4
    meta = loaded.meta
    fp = meta.get("fingerprint") or {}
    provenance = ", ".join(
        str(x)
        for x in (
            f"torch {fp.get('torch_version', '?')}",
            f"CUDA {fp['cuda_version']}" if fp.get("cuda_version") else "no CUDA",
            rp.hardware_class(meta) or "unknown hardware class",
            f"amp-harness {meta.get('harness_version', '?')}",
            str(meta.get("finished", "?"))[:10],
        )
    )
    out.mkdir(parents=True, exist_ok=True)
    missing = 0
    used: set[str] = set()  # script names written: one metric failed at two dtypes keeps two scripts
    for r, tags in rows:
        rerun = f"pytest '{r['nodeid']}'" + (
            f" --hypothesis-seed={meta['options']['hypothesis_seed']}"
            if (meta.get("options") or {}).get("hypothesis_seed")
            else ""
        )
        spec = tags.get("repro")
        issue_id = str(r["metric"]).removeprefix("known_issue.")
        if not isinstance(spec, dict) and str(r["metric"]).startswith("known_issue.") and issue_id in R.REPRODUCTIONS:
            # a registry check that failed: the issue's own script shows what the check saw
            path = out / f"{issue_id.replace('-', '_')}.py"
            atomic.write_text(path, R.script(issue_id, f"{provenance}; for {r['nodeid']} (run {run_dir.name})"))
            present = r["value"] is not None and float(r["value"]) == 1.0  # the row's value: whether it occurred
            print(
                f"{path}  (known issue {issue_id} {'occurs' if present else 'appears fixed'} here, unlike its "
                f"registry: the script exits {int(present)} on this stack)"
            )
            continue
        if not isinstance(spec, dict):
            missing += 1
            why = tags.get("no_script") or "checks of this kind do not record one yet"
            print(
                f"{r['nodeid']} :: {r['metric']}: no standalone reproduction recorded ({why}); rerun it with the harness: {rerun}"
            )
            continue
        stem = _unique_stem(str(r["metric"]), str(r.get("dtype") or ""), used)
        tensors: dict[str, torch.Tensor] = {}
        inputs_file = None
        if spec.get("attachment"):
            attached = run_dir / str(spec["attachment"])
            if not attached.is_file():
                missing += 1
                print(f"{r['nodeid']} :: {r['metric']}: its saved inputs {attached} are missing; rerun: {rerun}")
                continue
            data = attached.read_bytes()
            tensors = FR.load_tensors(data)
            if FR.needs_file(tensors):
                inputs_file = f"{stem}.pt"
                atomic.write_bytes(out / inputs_file, data)
        header = FR.header(spec, str(r["nodeid"]), str(r["metric"]), run_dir.name, provenance, rerun, f"{stem}.py")
        script = FR.render(spec, tensors, header, inputs_file)
        atomic.write_text(out / f"{stem}.py", script)
        print(out / f"{stem}.py")
    return 3 if missing else 0


def _cmd_qualify(args: argparse.Namespace, rest: list[str]) -> int:

    optional = _capability_list(args.optional, "--optional")
    required = _capability_list(args.require, "--require") if args.require else None
    if required is not None:
        required = [c for c in required if c not in optional]
    return qualify.run([*args.tests, *rest], Path(args.report_dir), required, optional, resume=args.resume)


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Usage errors raise (the command decides the exit status) instead of exiting with 2,
    which qualify uses for "not qualified"."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _cmd_audit(args: argparse.Namespace) -> int:
    from harness.apps import audit  # lazy: the audit imports torch

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    return audit.main(devices, args.processes, Path(args.baseline_dir))


def _cmd_burn_in(args: argparse.Namespace) -> int:
    from harness.apps import burn_in  # lazy: the burn-in imports torch

    return burn_in.main(args.minutes, args.device, Path(args.baseline_dir), Path(args.report_dir))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="amp-harness", description=__doc__)
    parser.add_argument("--version", action="version", version=f"amp-harness {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("profile", help="detect this machine's hardware profile and hardware classes")
    p.add_argument("--json", action="store_true", help="print the whole fingerprint as JSON")
    p.add_argument("--baseline-dir", default="baselines", help="where calibrated classes are looked up")
    p.set_defaults(func=_cmd_profile)
    b = sub.add_parser("baselines", help="validate every baseline file (format version, JSON, no NaN)")
    b.add_argument("--baseline-dir", default="baselines", help="baseline root (default: baselines)")
    b.set_defaults(func=_cmd_baselines)
    r = sub.add_parser(
        "report",
        help="summarise a run report (a run directory, or the latest under a report dir); 'report recover [DIR]': "
        "make the reports of sessions that died from their journals",
    )
    r.add_argument("path", nargs="*", help="a run or report directory (default amp-reports), or: recover [DIR ...]")
    r.set_defaults(func=_cmd_report)
    d = sub.add_parser("dashboard", help="one self-contained HTML dashboard over many run reports")
    d.add_argument("reports", nargs="*", help="run directories, report directories or rows.parquet files")
    d.add_argument("--fleet", help="a fleet dataset (amp-harness publish) instead: its latest runs per class and stack")
    d.add_argument("-o", "--output", default="dashboard.html")
    d.add_argument("--window", type=int, default=5, help="previous runs whose median is the reference (default 5)")
    d.set_defaults(func=_cmd_dashboard)
    c = sub.add_parser(
        "diff",
        aliases=["compare"],
        help="what changed between two runs: regressed, improved, new, missing, changed (exit 1 when B regressed)",
    )
    c.add_argument("run_a", help="run A: a run report directory, or a report directory (its latest run)")
    c.add_argument("run_b", help="run B: the same")
    c.add_argument(
        "--format", choices=("text", "md", "csv", "html"), default="text", help="output format (default text)"
    )
    c.add_argument("-o", "--output", help="write the output to this file instead of standard output")
    c.add_argument("--csv", help="also write every entry, unchanged ones included, as CSV")
    c.add_argument(
        "--fleet",
        help="read A and B from this fleet dataset: each a selector such as 'stack=torch-2.13,hardware_class=cpu-' "
        "(the latest matching run) or a run id",
    )
    c.set_defaults(func=_cmd_diff)
    u = sub.add_parser(
        "publish", help="add run reports to a fleet dataset (partitioned by hardware class, stack, date)"
    )
    u.add_argument("runs", nargs="+", help="run report directories, or report directories (all their runs)")
    u.add_argument("--fleet", required=True, help="the fleet dataset's directory (a shared or mounted directory)")
    u.set_defaults(func=_cmd_publish)
    k = sub.add_parser(
        "calibrate", help="measure AMP speedups here and write this hardware class's thresholds to the baseline dir"
    )
    k.add_argument("--device", default="cpu", help="cpu or cuda:N (default cpu)")
    k.add_argument(
        "--cases",
        nargs="+",
        metavar="WORKLOAD/DTYPE",
        help="calibrate only these cases (default: all of the default tier); others already in the file are kept",
    )
    k.add_argument(
        "--compiled",
        action="store_true",
        help="also calibrate compiled AMP in bf16 (torch.compile with Inductor: against eager AMP and compiled fp32)",
    )
    k.add_argument(
        "--allreduce",
        action="store_true",
        help="calibrate only the all-reduce bus bandwidth floors, on --world spawned ranks (gloo on the CPU, NCCL "
        "with as many GPUs), or on the world torchrun launched (run it under torchrun: rank 0 writes); a plain "
        "calibration on the CPU calibrates the spawned ranks' floors too",
    )
    k.add_argument("--world", type=_positive_int, default=2, help="ranks spawned for --allreduce (default 2)")
    k.add_argument("--runs", type=_positive_int, default=5, help="independent measurements per workload (default 5)")
    k.add_argument(
        "--rounds",
        type=_positive_int,
        default=None,
        help="a fixed number of interleaved rounds per measurement (default: adaptive, as the speed checks measure: "
        "until the speedup's 95%% interval is narrow, within a time cap)",
    )
    k.add_argument("--baseline-dir", default="baselines", help="baseline root; the file goes to <dir>/profiles/")
    k.set_defaults(func=_cmd_calibrate)
    kn = sub.add_parser(
        "kernels",
        help="list the CPU kernel sets of the kinds CI proves, or run a command under one (-- command)",
        description="amp-harness kernels [NAME -- command ...]: without NAME, list the kernel sets; with one, run "
        "the command with that kind's oneDNN and ATen caps and an Inductor cache of its own.",
    )
    kn.add_argument("name", nargs="?", help="the kernel set (zen4, avx2, intel-noamx)")
    rp_ = sub.add_parser(
        "repro",
        help="write standalone scripts (torch and torchao only) reproducing the registered known issues, or the "
        "failed checks of a run report (--report)",
        description="amp-harness repro [--known ID | --report RUN [--check TEXT]] [-o DIR]: each script needs only "
        "torch (and the library concerned), prints measured vs allowed and exits 1 while the defect is present, 0 "
        "once fixed, 2 if it could not run. With --report: exit 0 each failed check has its script, 3 some recorded "
        "none (each named with the command that reruns it), 4 nothing failed or matched.",
    )
    rp_.add_argument("--known", action="append", default=[], metavar="ISSUE", help="one issue (default: all)")
    rp_.add_argument("-o", "--output", default="repro", help="directory for the scripts (default: repro)")
    rp_.add_argument("--list", action="store_true", help="list the registered known issues")
    rp_.add_argument(
        "--report", metavar="RUN", help="a run report (or a report directory: its newest run): its failed checks"
    )
    rp_.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="TEXT",
        help="only failed checks whose node id or row contains TEXT",
    )
    rp_.set_defaults(func=_cmd_repro)
    q = sub.add_parser(
        "qualify",
        help="run the suites (or your tests) and print a verdict per capability",
        description="amp-harness qualify [options] [tests ...] [-- pytest options]: runs pytest (default: suites/) "
        "and prints one verdict per capability. Exit 0 qualified, 1 a required capability failed, 2 one is noisy, "
        "not judged or did not run, 4 usage error.",
    )
    q.add_argument("tests", nargs="*", help="test paths (default: suites/); pytest options go after --")
    q.add_argument("--report-dir", default="amp-reports", help="run report and JUnit XML go here (default amp-reports)")
    q.add_argument(
        "--optional",
        action="append",
        default=[],
        metavar="CAP[,CAP...]",
        help="capabilities whose verdict does not decide the exit status (comma-separated or repeated), e.g. speed",
    )
    q.add_argument(
        "--resume",
        action="store_true",
        help="the report directory holds earlier parts of this qualification, cut short: run only the tests "
        "without a result there, and judge every part together",
    )
    q.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="CAP[,CAP...]",
        help="the capabilities that decide the exit status (default: all for suites/, else those your tests decide)",
    )
    bi = sub.add_parser(
        "burn-in",
        help="loop the known answers for a time budget, bitwise against a healthy card's (exit 1: a mismatch)",
    )
    bi.add_argument("--minutes", type=float, required=True, help="how long to loop (e.g. 1, 10, 60)")
    bi.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    bi.add_argument("--baseline-dir", default="baselines", help="where the recorded answers are (default baselines)")
    bi.add_argument("--report-dir", default="amp-reports/burn-in", help="journal and scripts go here")
    bi.set_defaults(func=_cmd_burn_in)
    au = sub.add_parser(
        "audit",
        help="the known answers on several devices at once: the odd one out by majority (exit 1: an odd device)",
    )
    au.add_argument("--devices", default="cpu", help="comma-separated: cuda:0,cuda:1 ... or cpu (default cpu)")
    au.add_argument("--processes", type=int, default=2, help="on the CPU: processes on disjoint cores (default 2)")
    au.add_argument("--baseline-dir", default="baselines", help="the recorded answers break a tie of two devices")
    au.set_defaults(func=_cmd_audit)
    rl = sub.add_parser(
        "release",
        help="qualify a torch release: suites in an isolated environment and here, one release report (exit 1: a regression)",
        description="amp-harness release REQUIREMENT [--with PKG ...] [-- pytest options]: builds an environment "
        "holding REQUIREMENT (torch==2.15.0, a nightly, a local wheel) and this checkout, runs pytest suites/ there "
        "and here, and prints the release report. Exit 0 when nothing but known issues and reviewed behaviour "
        "changed, 1 a check failed or regressed, 2 usage or environment error. See docs/release.md.",
    )
    rl.add_argument(
        "requirement", nargs="?", help="the torch requirement, e.g. torch==2.15.0 (not needed with --candidate)"
    )
    rl.add_argument(
        "--with", dest="extra", action="append", default=[], metavar="PKG", help="also install, e.g. torchao==0.18.0"
    )
    rl.add_argument("--env", default=".release-env", help="the environment's directory (default .release-env; reused)")
    rl.add_argument("--report-dir", default="amp-reports/release", help="both runs' reports go here")
    rl.add_argument("--candidate", help="judge this run report of the new release instead of making one")
    rl.add_argument("--reference", help="judge against this run report instead of running the suites here")
    rl.add_argument("-o", "--output", help="also write the report to this file")
    rl.set_defaults(func=_cmd_release)
    argv = list(sys.argv[1:] if argv is None else argv)
    own, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    try:
        args = parser.parse_args(own)
        if args.command == "qualify":
            return _cmd_qualify(args, rest)
        if args.command == "kernels":
            return _cmd_kernels(args, rest)
        if args.command == "release":
            return _cmd_release(args, rest)
        if rest:
            raise _UsageError(f"unrecognized arguments: -- {' '.join(rest)}")
        return int(args.func(args))
    except _UsageError as exc:
        if own[:1] != ["qualify"]:
            print(f"amp-harness: usage error: {exc}", file=sys.stderr)
            return 2

        hint = " (pytest options go after --: amp-harness qualify tests/ -- -k parity)"
        print(f"amp-harness: usage error: {exc}{hint}", file=sys.stderr)
        return qualify.USAGE_ERROR
    except rp.ReportError as exc:
        print(f"amp-harness: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
