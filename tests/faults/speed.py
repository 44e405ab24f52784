"""Faults of the speed family: what a shared host does to a timing (contention the harness cannot
prevent and must not read as a verdict, a clock that misreads) and the slowed paths it must catch
(a low-precision GEMM twice as slow, a matmul slowed under autocast, an all-reduce twice as slow).
Each is a factory ``fault(original) -> replacement`` or a kernel, installed by an injected conftest
like :mod:`faults.stacks`."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from faults.stacks import kernel
from harness.domains.engines.bench.bench import DETECT_SLOWDOWN, Clocks
from harness.domains.engines.bench.inject import slowed


def baseline_slowed_by_a_neighbour(real: Callable[..., tuple[Any, Any]]) -> Callable[..., tuple[Any, Any]]:
    """``Workload.pair`` whose baseline runs DETECT_SLOWDOWN times slower on the CPU's judging clock
    (it spins on the timing thread's CPU time): a neighbour contending for the baseline's kernels
    only, or the baseline's own slower mode, neither of which the contention probe (the AMP dtype's
    matmul) times. With the AMP path slowed as much, the speedup reads clean."""

    def pair(self: Any, device: torch.device, dtype: torch.dtype) -> tuple[Any, Any]:
        base, amp = real(self, device, dtype)
        return slowed(base, DETECT_SLOWDOWN, 0.0, device), amp

    return pair


def clock_reads_zero(real: Clocks) -> Clocks:
    """The clocks a CPU block is judged and timed by, reading 0 always: a clock that stopped (the
    calibration the issue saw sized a block of 5 million calls from a call read as no time)."""

    def zero() -> float:
        return 0.0

    return Clocks(judged=zero, wall=zero)


def clock_goes_backwards(real: Clocks) -> Clocks:
    """The clocks running backwards: each read a millisecond earlier than the one before."""
    ticks = itertools.count()

    def backwards() -> float:
        return 1e6 - 1e-3 * next(ticks)

    return Clocks(judged=backwards, wall=backwards)


def matmul_slowed_under_autocast(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.__matmul__`` running at half speed under autocast (a low-precision kernel that
    regressed): each call spins as long again as it computed, on this thread's CPU time (the clock
    a CPU speedup is judged by); outside autocast, fp32, it is untouched."""
    import time

    def matmul(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(self.device.type):
            return real(self, other)
        start = time.thread_time()
        out = real(self, other)
        end = time.thread_time() * 2 - start
        while time.thread_time() < end:
            pass
        return out

    return matmul


def register_lowp_gemm_twice_as_slow() -> Any:
    """aten::mm's CPU kernel taking twice its time on bfloat16 and float16 operands (each product
    computed twice through ``mm.out``), its result unchanged; float32 untouched: a low-precision
    GEMM kernel that regressed in speed only, below every Python API, autocast and the speed
    gate's contention probe (a low-precision matmul too) alike."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.mm.out(a, b, out=out)
        if a.dtype in (torch.bfloat16, torch.float16):
            torch.ops.aten.mm.out(a, b, out=out)
        return out

    return kernel("mm", mm, "CPU")


def all_reduce_slowed(tensor: torch.Tensor) -> None:
    """An all-reduce twice as slow as the backend's (a degraded link, a misconfigured transport):
    the real collective, then a pause as long as it took. Twice, not the 1.3x a judged floor is
    placed to catch: a loopback calibration that just passes the scatter test still lets a clean
    run stray close to the floor, and the control must not depend on a quiet host."""
    start = time.perf_counter()
    dist.all_reduce(tensor)
    time.sleep(time.perf_counter() - start)
