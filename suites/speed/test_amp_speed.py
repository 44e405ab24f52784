"""Claim family: mixed precision is as fast on this machine as this class of machine was.

The source text claims 2-3x speedups and warns that on CPUs or old GPUs mixed precision can be
slower. Each workload's AMP-over-fp32 speedup is measured in one run, interleaved (fp32, AMP,
fp32, AMP ...), and judged against the threshold calibrated on this machine's *hardware class*
(``<baseline-dir>/profiles/<class>.json``, written by ``amp-harness calibrate``): relative to the
class's own speed, so a 1.3x slower AMP path fails whether AMP is 4x faster or 2x slower there.
A failure counts only when a second measurement confirms it. A class with no calibration is
measured and recorded, NOT JUDGED, with the command that calibrates it. Whether AMP pays off on the class is reported as a finding of its own.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.speed import bench, thresholds
from harness.domains.speed import verdict as speed
from harness.numerics.verdict import Outcome

pytestmark = pytest.mark.amp_capability("speed")

#: Interleaved rounds per measurement: 7 gives a median and quartiles.
ROUNDS = 7
THOROUGH = [(w, d) for w in bench.WORKLOADS for d in ("bfloat16", "float16") if (w, d) not in thresholds.DEFAULT_CASES]


def _pedantic(benchmark, group=None):
    """pytest-benchmark's pedantic runner as the narrow callback bench.interleaved_pedantic takes:
    the AMP blocks become the test's pytest-benchmark result (--benchmark-json, --benchmark-autosave,
    --benchmark-compare ...). None when pytest-benchmark is disabled (then the harness times alone)."""
    if benchmark is None:
        return None
    if getattr(benchmark, "disabled", True):
        benchmark(lambda: None)  # disabled (--benchmark-disable, or under xdist): used, times nothing
        return None

    benchmark.group = group  # before the run: pytest-benchmark files the result under it

    def run(target, setup, rounds):
        benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)
        return list(benchmark.stats.stats.data)

    return run


def _measure(workload, device, dtype, slowdown, pedantic=None) -> bench.Timing:
    fp32, amp = workload.make(device, None), workload.make(device, dtype)
    if slowdown != 1.0:
        probe = bench.interleaved(fp32, amp, device, rounds=3)
        amp = bench.slowed(amp, slowdown, probe.amp_median_s)
    if pedantic is not None:
        return bench.interleaved_pedantic(fp32, amp, device, ROUNDS, pedantic)
    return bench.interleaved(fp32, amp, device, rounds=ROUNDS)


#: The default tier's cases, then the wider sweep (thorough tier).
CASES = [
    *thresholds.DEFAULT_CASES,
    *(pytest.param(c, marks=pytest.mark.amp_thorough) for c in THOROUGH),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_amp_speedup_meets_the_class_threshold(
    case,
    amp_device,
    amp_hardware_profile,
    amp_record,
    amp_slowdown,
    amp_calibrate_command,
    request,
    benchmark,
    amp_require_speedup,
):
    if hasattr(request.config, "workerinput"):
        _pedantic(benchmark)  # pytest-benchmark disables itself under xdist: mark its fixture used
        pytest.skip("speed is measured one test at a time: run the speed suite without -n (xdist shares the cores)")
    name, dtype_name = case
    workload, dtype = bench.WORKLOADS[name], getattr(torch, dtype_name)
    prof = amp_hardware_profile
    th = thresholds.for_device(prof.threshold(name, dtype_name), name, amp_device, dtype)
    decide = lambda t: speed.judge(name, dtype_name, prof.hardware_class, t, th, amp_calibrate_command)  # noqa: E731
    pedantic = _pedantic(benchmark, f"{name}/{dtype_name}")
    first = decide(_measure(workload, amp_device, dtype, amp_slowdown, pedantic))
    v = first
    if first.outcome in (Outcome.NOISY, Outcome.FAIL):
        # A failure must be confirmed by a second measurement, and a noisy one is measured once
        # more (the PyTorch HUD's rule: a regression only after 2 consecutive violations). On a
        # shared 2-core VM one clean case in about 60 falls below its threshold once; twice in a
        # row, none was seen; a 1.3x slower path still fails both (tests/test_speed_and_qualify.py).
        v = decide(_measure(workload, amp_device, dtype, amp_slowdown))  # the harness times the rerun
    timing = v.timing
    tags = {
        "workload": name,
        "rounds": ROUNDS,
        "iqr": timing.spread,
        "fp32_s": timing.fp32_median_s,
        "amp_s": timing.amp_median_s,
        "hardware_class": prof.hardware_class,
        "calibrated_median": th.calibrated_median if th else None,
        "first_measurement": {"outcome": first.outcome.value, "speedup": first.timing.speedup},
    }
    if pedantic is not None:
        benchmark.extra_info.update(
            {
                "timed": "AMP blocks (the pytest-benchmark result) interleaved with fp32 blocks (extra_info)",
                "fp32_s_per_iteration": list(first.timing.fp32_s),
                "amp_s_per_iteration": list(first.timing.amp_s),
                "speedup_first_measurement": first.timing.speedup,
                "speedup_judged": timing.speedup,
                "verdict": v.outcome.value,
                "threshold": v.limit,
                "hardware_class": prof.hardware_class,
            }
        )
    if workload.flops:
        for label, secs, dt in (("fp32", timing.fp32_median_s, "float32"), ("amp", timing.amp_median_s, dtype_name)):
            rate = workload.flops / secs
            peak = prof.peak_flops.get(dt)
            amp_record(
                f"{name}.{label}.flops_per_s",
                rate,
                unit="FLOP/s",
                dtype=dt,
                device=amp_device,
                expected=peak,
                note=f"fraction of peak {rate / peak:.3g} ({prof.peak_origin})" if peak else "no published peak",
            )
    if not amp_require_speedup:
        amp_record(
            f"{name}.amp_pays_off",
            timing.speedup >= 1.0,
            dtype=dtype,
            device=amp_device,
            tags={"speedup": timing.speedup},
            note=thresholds.pays_off(name, dtype_name, timing.speedup, prof.hardware_class),
        )
    drift = thresholds.TREND_DRIFT
    if v.outcome in (Outcome.PASS, Outcome.FAIL):
        amp_record.require(v.claim(), dtype=dtype, device=amp_device, tags=tags, drift=drift)
    if amp_require_speedup and v.outcome is not Outcome.NOISY:
        amp_record.require(
            thresholds.pays_off_claim(name, dtype_name, timing.speedup, prof.hardware_class),
            dtype=dtype,
            device=amp_device,
            drift=drift,
        )
    if v.outcome in (Outcome.PASS, Outcome.FAIL):
        return
    amp_record(
        f"{name}.speedup",
        timing.speedup,
        allowance=v.limit,
        unit="x",
        outcome=v.outcome,
        dtype=dtype,
        device=amp_device,
        tags=tags,
        note=v.reason,
        # a NOISY speedup is no verdict against the threshold, but the same statistic as a trend
        comparable=v.outcome is Outcome.NOISY,
        drift=drift if v.outcome is Outcome.NOISY else None,
    )
    if v.outcome is Outcome.NOISY:
        pytest.skip(
            f"NOISY: {name}/{dtype_name} speedup {timing.speedup:.3g}x with IQR {timing.spread:.3g} "
            f"straddles the threshold {v.limit}"
        )
