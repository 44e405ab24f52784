"""Calibrating a hardware class: each case's threshold from repeated, interleaved measurements.

The policy lives here, the command (``amp-harness calibrate``) only reads options, prints and
writes the profile. Run-major, as the suite measures: each run goes through every case once, so
every case is calibrated in the conditions (caches, clocks, neighbours) the suite measures it in.
A first pass is not counted: a case's first measurement in a process runs low while the allocator
and caches first meet its tensors (docs/hardware-and-speed.md); the suite's rerun
of a failure is warm too.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from harness.domains.engines.bench import bench, sizing
from harness.domains.speed import thresholds
from harness.domains.speed.thresholds import Threshold

Case = tuple[str, str]

#: Passes of retakes a calibration may take, per ``runs``: contended spells last tens of seconds and a
#: pass measures only the cases still wanting (2 s each); twice ``runs`` passes left cases scattered
#: in one calibration in three (docs/hardware-and-speed.md).
RETAKE_PASSES = 4

#: The share of `pytest suites/`'s 150 s budget (2 cores) the speed checks may take when every
#: case is judged: 40%, about what they take where every case is judged (docs/running.md).
SPEED_SHARE_S = 0.4 * 150.0
#: The cases the default tier measures (the speed suite's, the compiled suite's calibrated ones and
#: the fp8 case) that share it.
DEFAULT_TIER_CASES = 10
#: A case is judged on a class only where its uncounted first measurement (bench.MIN_ROUNDS
#: rounds, warm-up and contention probe included, each path's first call not) took at most this long: its share of
#: SPEED_SHARE_S. Beyond it the suite could not afford the rounds a verdict needs (a failure is
#: measured twice); the case is recorded, not judged, and says so (where bf16 is emulated, one bf16
#: matmul 1024 takes seconds).
CASE_BUDGET_S = SPEED_SHARE_S / DEFAULT_TIER_CASES

#: A calibration stops measuring past this (wall clock): the cases it has not measured enough are
#: recorded, NOT JUDGED, naming the cap. Three times the 5 minutes a whole ``calibrate --compiled``
#: may take on a 2-core machine (the qualification requirement, docs/hardware-and-speed.md), so a
#: contended host's slower calibration still ends, and one whose measurements never do is stopped.
CALIBRATION_CAP_S = 3 * 300.0


@dataclass(frozen=True)
class CaseResult:
    """One case's calibration: its threshold and the sentence that says what was found."""

    case: Case
    threshold: Threshold
    said: str


def over_budget(case: Case, seconds: float) -> Threshold:
    """The unjudged threshold of a case whose first measurement took ``seconds``."""
    return Threshold(
        "record",
        None,
        f"not judged on this class: {bench.MIN_ROUNDS} rounds of {'/'.join(case)} took {seconds:.3g} s, more than "
        f"the {CASE_BUDGET_S:.3g} s a case may take in the default tier ({SPEED_SHARE_S:g} s of speed checks over "
        f"{DEFAULT_TIER_CASES} cases); recorded with the fewest rounds",
    )


def stopped(case: Case, why: str) -> Threshold:
    """The unjudged threshold of a case whose measurement was stopped at a cap (``why``)."""
    return Threshold(
        "record",
        None,
        f"not judged on this class: the measurement of {'/'.join(case)} was stopped: {why}; recorded, and "
        "calibrated again when `amp-harness calibrate` measures it to its end",
    )


def faster_first(case: Case, threshold: Threshold, first: bench.Timing) -> Threshold:
    """``threshold``, or a recorded one where the case's uncounted first measurement ran faster
    than the counted runs' median by more than MAX_CALIBRATION_SCATTER.

    The suite measures each case once, early in its process, and a pass is not measured again: a
    path slowed DETECT_SLOWDOWN times in such a faster mode lands above median / sqrt(DETECT_SLOWDOWN)
    and passes. On the AVX2 kind fp16 matmul 256 ran 1.17x faster in its first measurement than in
    the runs after it, and a 1.3x slower path passed its threshold (docs/hardware-and-speed.md). A
    slower first measurement (cold caches) is no such risk: a failure is confirmed by a second one."""
    median = threshold.calibrated_median
    if not threshold.judged or median is None or first.speedup <= median * thresholds.MAX_CALIBRATION_SCATTER:
        return threshold
    return dataclasses.replace(
        threshold,
        expect="record",
        min_speedup=None,
        origin=f"calibrated: the uncounted first measurement of {'/'.join(case)} ran {first.speedup:.3g}x, "
        f"{first.speedup / median:.3g}x the counted runs' median {median:.3g} (more than "
        f"{thresholds.MAX_CALIBRATION_SCATTER:.3g}x): the suite measures a case first in its process, where a "
        f"{bench.DETECT_SLOWDOWN}x slower path would pass the threshold; too unsteady here to judge, recorded",
    )


def calibrate(
    cases: Sequence[Case],
    workloads: Mapping[str, bench.Workload],
    device: torch.device,
    *,
    runs: int,
    rounds: int | None,
    stored: Mapping[str, Threshold],
    log: Callable[[str], None],
    hardware_class: str,
    launch_floor_s: float | None = None,
) -> list[CaseResult]:
    """Measure every case ``runs`` times (plus retakes) and place its threshold. ``stored``: the
    class's thresholds from an earlier calibration with the same torch (their probe times count).
    ``launch_floor_s``: the device's launch floor; each laddered case is then measured at the
    smallest rung that is compute-bound here (:mod:`harness.domains.engines.bench.sizing`), and its
    threshold keeps the rung (None: every case at its first rung)."""
    results: dict[Case, CaseResult] = {}
    rungs: dict[str, sizing.Sizing] = {}
    if launch_floor_s is not None:
        for workload in sorted({w for w, _ in cases}):
            known = workloads[workload]
            if known.sizes and known.missing(device) is None:
                rungs[workload] = sizing.choose(known, launch_floor_s, lambda w: sizing.fp32_call_s(w, device))
                log(f"  size: {rungs[workload].describe()}")
    workloads = {**workloads, **{w: s.workload for w, s in rungs.items()}}
    measured: list[Case] = []
    first: dict[Case, bench.Timing] = {}  # each case's uncounted first measurement
    # one probe per dtype, sized for this kind (bench.probe_side) and stored with the thresholds
    sides = {d: bench.probe_side(device, getattr(torch, d)) for d in sorted({d for _, d in cases})}
    for d, side in sides.items():
        if side is not None and side != bench.PROBE_N:
            log(
                f"  contention probe {d}: {side}x{side} (a {bench.PROBE_N} probe call is over {bench.PROBE_CALL_S:g} s here)"
            )

    began = bench.CAP_CLOCK()
    capped: dict[Case, str] = {}

    def measure(case: Case, rounds: int | None, probe_ref_s: float | None = None) -> bench.Timing:
        workload, dtype = case
        if bench.CAP_CLOCK() - began > CALIBRATION_CAP_S:
            raise bench.Capped(f"the calibration ran past its cap of {CALIBRATION_CAP_S:g} s before measuring it")
        return bench.measure(
            workloads[workload],
            device,
            getattr(torch, dtype),
            rounds=rounds,
            probe_ref_s=probe_ref_s,
            probe_side=sides[dtype],
        )

    for case in cases:
        workload, dtype = case
        missing = workloads[workload].missing(device)
        if missing is not None:
            th = Threshold("record", None, f"not measured: {missing}")
            results[case] = CaseResult(case, th, f"{workload}/{dtype}: {th.origin}")
            continue
        start = time.perf_counter()
        try:
            t = measure(case, bench.MIN_ROUNDS)
        except bench.Capped as exc:
            th = stopped(case, str(exc))
            results[case] = CaseResult(case, th, f"{workload}/{dtype}: {th.origin}")
            log(f"  warm-up {workload}/{dtype}: {th.origin}")
            continue
        # what the rounds cost, less each path's first call (a compiled path compiles in it)
        took = time.perf_counter() - start - sum(t.first_call_s or (0.0, 0.0))
        log(f"  warm-up {workload}/{dtype} (not counted, {took:.3g} s): {t.describe()}")
        if took > CASE_BUDGET_S and device.type == "cpu":
            th = dataclasses.replace(over_budget(case, took), calibrated_median=t.speedup)
            results[case] = CaseResult(case, th, f"{workload}/{dtype}: {th.origin}")
            continue
        measured.append(case)
        first[case] = t
    timings: dict[Case, list[bench.Timing]] = {case: [] for case in measured}

    def counted(case: Case, rounds: int | None, probe_ref_s: float | None, what: str) -> bench.Timing | None:
        """One counted measurement of ``case``; None once the case (or the calibration) was stopped
        at a cap: a stopped case is not measured again."""
        if case in capped:
            return None
        try:
            t = measure(case, rounds, probe_ref_s)
        except bench.Capped as exc:
            capped[case] = str(exc)
            log(f"  {what} {'/'.join(case)}: NOT JUDGED, stopped: {exc}")
            return None
        log(f"  {what} {'/'.join(case)}: {t.describe()}")
        return t

    for run in range(runs):
        for case in measured:
            taken = counted(case, rounds, None, f"run {run + 1}/{runs}")
            if taken is not None:
                timings[case].append(taken)
    # The uncontended probe time of a dtype comes from every round of every case in it (one probe
    # kernel per dtype: the more rounds, the likelier some ran uncontended). A case is measured
    # again while it has fewer than ``runs`` runs with an interval of uncontended rounds, or while
    # its ``runs`` quietest runs (judged rounds' probe nearest the reference: chosen by the probe,
    # never by their speedup) scatter too much to be judged; run-major like the runs, so one
    # contended spell does not take all of a case's retakes, for at most RETAKE_PASSES x runs passes.
    own = {
        d: bench.probe_reference([p for (_, dt), ts in timings.items() if dt == d for t in ts for p in t.probe_s])
        for d in {dt for _, dt in measured}
    }
    refs = {d: thresholds.probe_reference(ref, dict(stored), d, sides[d]) for d, ref in own.items()}
    for d, ref in sorted(refs.items()):
        if ref is not None and ref != own[d]:
            log(
                f"  contention probe {d}: {ref * 1e3:.3g} ms uncontended, from this class's earlier calibration "
                f"(this one's rounds: {(own[d] or 0.0) * 1e3:.3g} ms at their fastest {bench.PROBE_REF_QUANTILE:.0%})"
            )
    kept = {
        case: [
            t
            for t in (dataclasses.replace(t, probe_ref_s=refs[case[1]]) for t in taken)
            if t.rounds >= bench.MIN_ROUNDS
        ]
        for case, taken in timings.items()
    }
    judgeable = [(w, d) for w, d in measured if thresholds.unchanged_by_autocast(w, device, getattr(torch, d)) is None]

    def quietest(case: Case) -> list[bench.Timing]:
        """The case's ``runs`` runs whose judged rounds ran quietest (probe nearest its reference)."""
        return sorted(kept[case], key=lambda t: t.judged_contention)[:runs]

    def wanting(case: Case) -> bool:
        chosen = quietest(case)
        if len(chosen) < runs:
            return True
        return not thresholds.threshold_from_calibration([t.speedup for t in chosen]).judged

    for retake in range(RETAKE_PASSES * runs):
        for case in [case for case in judgeable if wanting(case) and case not in capped]:
            retaken = counted(case, rounds, refs[case[1]], f"retake {retake + 1} (runs contended)")
            if retaken is not None and retaken.rounds >= bench.MIN_ROUNDS:
                kept[case].append(retaken)
    for case in measured:
        workload, dtype = case
        if case in capped:
            th = stopped(case, capped[case])
            results[case] = CaseResult(case, th, f"{workload}/{dtype}: {th.origin}")
            continue
        chosen = quietest(case)
        placed = dataclasses.replace(
            thresholds.calibrated([t.speedup for t in chosen], runs, refs[dtype], len(kept[case])),
            probe_side=sides[dtype],
            size=rungs[workload].size if workload in rungs else None,
            # the same runs' baseline time: a pass whose baseline runs slower was raised by it
            baseline_s=statistics.median(t.fp32_median_s for t in chosen) if chosen and device.type == "cpu" else None,
        )
        applied = thresholds.for_device(placed, workload, device, getattr(torch, dtype))
        assert applied is not None
        applied = faster_first(case, applied, first[case])
        if applied.calibrated_median is None:
            said = f"{workload}/{dtype}: {applied.origin}"
        else:
            finding = thresholds.pays_off(
                workload, dtype, applied.calibrated_median, hardware_class, workloads[workload].baseline_name
            )
            said = f"{finding}; {applied.origin}"
        results[case] = CaseResult(case, applied, said)
    return [results[case] for case in cases]
