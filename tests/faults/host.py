"""What a shared host does to a timing, for the speed rule's negative controls: contention the
harness cannot prevent and must not read as a verdict. Each is a factory ``fault(original) ->
replacement``, installed by an injected conftest like :mod:`faults.stacks`."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

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
