"""The plugin's side of the speed checks: the pytest-benchmark adapter and the skips.

Measuring, sizing and judging a speedup is :class:`harness.domains.speed.checks.SpeedChecks`; the
speed suite and the compiled suite reach it through :func:`check_speedup` (the ``amp_speedup``
fixture), which hands it pytest-benchmark's runner when enabled and turns what it says should be
skipped (NOISY, NOT JUDGED) into a skip.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.domains.engines.bench import bench, sizing
from harness.domains.engines.compiler import toolchain
from harness.domains.speed.checks import ClassSpeed, SpeedChecks
from harness.pytest_plugin.recording import Recorder
from harness.storage.profiles import Profile


def _pedantic(benchmark: Any, group: str | None = None) -> bench.Pedantic | None:
    """pytest-benchmark's pedantic runner as the narrow callback bench.interleaved_pedantic takes:
    the AMP blocks become the test's pytest-benchmark result (--benchmark-json, --benchmark-autosave,
    --benchmark-compare ...). None when pytest-benchmark is disabled (then the harness times alone)."""
    if benchmark is None:
        return None
    if getattr(benchmark, "disabled", True):
        benchmark(lambda: None)  # disabled (--benchmark-disable, or under xdist): used, times nothing
        return None

    benchmark.group = group  # before the run: pytest-benchmark files the result under it

    def run(target: bench.Fn, setup: bench.Fn, rounds: int) -> list[float]:
        benchmark.pedantic(target, setup=setup, rounds=rounds, iterations=1, warmup_rounds=0)
        return list(benchmark.stats.stats.data)

    return run


def check_speedup(
    workload: bench.Workload,
    dtype_name: str,
    *,
    device: torch.device,
    profile: Profile,
    record: Recorder,
    slowdown: float,
    calibrate_command: str,
    rounds: bench.Rounds | int | None = None,
    benchmark: Any,
    require_speedup: bool,
) -> None:
    """The speed check of ``workload`` in ``dtype_name`` (:class:`SpeedChecks`): its NOISY and NOT
    JUDGED outcomes skipped saying why, its pytest-benchmark result filled in. Under several xdist
    workers it runs with the machine to itself (:mod:`harness.pytest_plugin.machine`)."""
    __tracebackhide__ = True
    checks = SpeedChecks(
        record,
        device,
        ClassSpeed(profile.hardware_class, profile.threshold),
        sizing.device_speed(
            device,
            launch_floor_s=profile.launch_floor_s,
            published=profile.peak_flops,
            published_origin=profile.peak_origin,
        ),
        slowdown=slowdown,
        rounds=rounds,
        calibrate_command=calibrate_command,
        require_speedup=require_speedup,
        # The harness's own background work must not share the machine with a timing: Inductor's
        # ISA probe, started when compiled checks are selected, runs compilers and loader
        # subprocesses for 1-17 s; beside the first speed cases it made a 1.3x slower matmul NOISY
        # (busy) instead of FAIL.
        before_timing=toolchain.wait_for_warm_up,
    )
    pedantic = _pedantic(benchmark, f"{workload.name}/{dtype_name}")
    outcome = checks.check(workload, dtype_name, pedantic)
    v = outcome.verdict
    if pedantic is not None and v is not None and outcome.first is not None:
        benchmark.extra_info.update(
            {
                "timed": (
                    "the first AMP blocks (the measurement's least rounds) by wall clock (the pytest-benchmark result), interleaved "
                    f"with baseline blocks; judged: every round's ratio by {outcome.first.clock} (extra_info)"
                ),
                "clock": outcome.first.clock,
                "fp32_s_per_iteration": list(outcome.first.fp32_s),
                "amp_s_per_iteration": list(outcome.first.amp_s),
                "speedup_first_measurement": outcome.first.speedup,
                "speedup_judged": v.timing.speedup,
                "verdict": v.outcome.value,
                "threshold": v.limit,
                "hardware_class": profile.hardware_class,
                **({"size": outcome.sizing.size} if outcome.sizing is not None else {}),
            }
        )
    if outcome.skip is not None:
        pytest.skip(outcome.skip)
