"""Faults the harness's negative controls inject into a speed measurement: an AMP path made
slower by a known factor, which the speed gate must catch."""

from __future__ import annotations

import time
from typing import Any

import torch

from harness.domains.engines.bench.workload import Fn


def slowed(fn: Fn, factor: float, seconds_per_call: float, device: torch.device | None = None) -> Fn:
    """``fn`` made ``factor`` times slower by busy-waiting (for the harness's negative controls).

    On the CPU each call then spins ``factor - 1`` times its own CPU time, read on the judging clock
    (this thread's CPU time), so the path is ``factor`` times slower whatever the machine does
    meanwhile: a fixed wait sized from a probe was a smaller slowdown whenever the path ran slower
    than during the probe, and a wall-clock wait shrinks on the judging clock whenever the thread
    is preempted in it. On CUDA, where a call returns before its kernels finish, the wait is
    ``factor - 1`` times ``seconds_per_call``, the synchronised median of a probe, by wall clock.
    """
    extra = (factor - 1.0) * seconds_per_call
    on_cpu = device is None or device.type == "cpu"

    def run() -> Any:
        if on_cpu:
            start = time.thread_time()
            out = fn()
            now = time.thread_time()
            end = now + (factor - 1.0) * (now - start)
            while time.thread_time() < end:
                pass
            return out
        out = fn()
        end = time.perf_counter() + extra
        while time.perf_counter() < end:
            pass
        return out

    return run
