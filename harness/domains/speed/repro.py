"""A failed speed check as a script: the workload's own source, timed as the check times it.

A speedup is a property of a machine, so the script is a benchmark to run on a machine of the
class that failed: AMP against fp32 in interleaved rounds (fp32 block, AMP block, ...), on this
thread's CPU time with torch on one thread (CUDA: events after a synchronise), the median of the
rounds' ratios, against the class's calibrated threshold. As in the check, a failure counts only
when a second measurement confirms it. The contention probe and the busy-machine rule stay in the
harness: run the script on an idle machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness.domains.repro import FailureRepro
from harness.domains.speed.bench import BLOCK_S, CPU_THREADS, MIN_ROUNDS
from harness.domains.speed.workloads import Workload

if TYPE_CHECKING:
    from harness.domains.repro import FailureRepro

_TIMING = """import statistics
import time

DEVICE, DTYPE = torch.device({device!r}), torch.{dtype}
THRESHOLD = {threshold!r}  # the speedup the check required (its origin: the allowance, below)
ROUNDS, BLOCK_S = {rounds!r}, {block_s!r}  # interleaved rounds, as the check took; seconds of a block
if DEVICE.type == "cpu":
    torch.set_num_threads({threads})  # as the check times it: torch's work on this thread, on its CPU clock

# the workload, as the harness builds it from this text
{prelude}

{source}


def per_call(fn, n):  # seconds per call over n calls: this thread's CPU time (CUDA: events, synchronised)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / n
    start = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - start) / n


def speedup():  # the median over ROUNDS of fp32's seconds per call over AMP's, blocks interleaved
    fp32, amp = make(DEVICE, None), make(DEVICE, DTYPE)
    for fn in (fp32, amp, fp32, amp):  # warm-up
        fn()
    n32, namp = (max(1, round(BLOCK_S / per_call(fn, 1))) for fn in (fp32, amp))
    return statistics.median(per_call(fp32, n32) / per_call(amp, namp) for _ in range(ROUNDS))


first = speedup()
second = speedup() if first < THRESHOLD else first  # as the check: a second measurement confirms a failure
print(f"{name}: AMP ({{DTYPE}}) over fp32 {{first:.3g}}x, then {{second:.3g}}x; required {{THRESHOLD}}x")
measured = THRESHOLD / max(first, second)  # how far the better measurement falls short: <= 1 meets it
allowed = 1.0"""


def repro_of(
    workload: Workload, dtype_name: str, threshold: float, origin: str, rounds: int, device: torch.device
) -> FailureRepro | None:
    """The script of a speedup below ``threshold`` (``origin``: where it comes from), or None where
    the workload has no script (compiled paths, a baseline other than fp32)."""

    if workload.script is None or workload.baseline is not None or workload.compiled_paths:
        return None
    prelude = workload.script.prelude()
    if prelude is None:
        return None
    code = _TIMING.format(
        device=device.type,
        dtype=dtype_name,
        threshold=threshold,
        rounds=max(MIN_ROUNDS, rounds),
        block_s=BLOCK_S,
        prelude=prelude[0].rstrip("\n"),
        threads=CPU_THREADS,
        source=workload.script.source,
        name=workload.name,
    )
    return FailureRepro(
        "speed",
        f"{workload.name}: the {dtype_name} autocast path's speedup over fp32 on {device.type}, interleaved "
        "(run it on an idle machine of the class that failed)",
        code,
        origin,
        prelude[1],
        device=device.type,
    )
