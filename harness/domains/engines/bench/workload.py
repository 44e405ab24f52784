"""What the timing bench times: a workload, its size ladder, and its text for a failed check's script.

The speed family's catalogue (:mod:`harness.domains.speed.workloads`), the compiled family's and
the fp8 family's workloads are all of this one type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Fn = Callable[[], Any]


@dataclass(frozen=True)
class Script:
    """A workload as text: ``source`` defines ``make(DEVICE, DTYPE)`` returning ``run``, reading
    names that ``prelude()`` defines in a script, as source text and tensors saved beside it (None:
    the names cannot be written out)."""

    source: str
    prelude: Callable[[], tuple[str, dict[str, torch.Tensor]] | None]


@dataclass(frozen=True)
class Workload:
    name: str
    #: (device, autocast dtype or None for fp32) -> a zero-argument function doing one iteration
    make: Callable[[torch.device, torch.dtype | None], Fn]
    #: floating-point operations of one iteration (None: not a FLOP-bound workload)
    flops: float | None
    #: the catalogue op whose autocast policy decides whether AMP changes this workload at all
    #: (None: it always does). Where autocast leaves it in fp32, the two paths are one computation.
    autocast_op: str | None = None
    #: (device, autocast dtype) -> the function the AMP path is compared with, where it is not the
    #: workload in fp32 (compiled AMP against eager AMP, for one)
    baseline: Callable[[torch.device, torch.dtype], Fn] | None = None
    #: what the baseline is, in words (the speedup's denominator)
    baseline_name: str = "fp32"
    #: the dtype the baseline runs in (None: the AMP path's, as eager AMP under compiled AMP)
    baseline_dtype: str | None = "float32"
    #: which paths ("baseline", "amp") are compiled: their first call, timed in the warm-up, is
    #: recorded as the compile time
    compiled_paths: frozenset[str] = frozenset()
    #: device -> why the AMP path's kernel does not exist there (named, with the kernel set), or None
    #: where it runs: such a case is not measured, neither by the suite nor by calibration
    unavailable: Callable[[torch.device], str | None] | None = None
    #: what a failed check's script times: the text ``make`` was built from (None: no script)
    script: Script | None = None
    #: the size ladder, smallest first (sizes[0] is the size this workload is built at; empty: one
    #: size). The speed checks measure the smallest rung that is compute-bound on the device
    #: (:mod:`harness.domains.engines.bench.sizing`)
    sizes: tuple[int, ...] = ()
    #: what a size is (``N``: an N x N matmul)
    size_name: str = ""
    #: size -> this workload at that rung (its computation, FLOP count and script)
    resize: Callable[[int], Workload] | None = None

    def at(self, size: int) -> Workload:
        """This workload at rung ``size`` of its ladder."""
        if not self.sizes or size == self.sizes[0]:
            return self
        if size not in self.sizes or self.resize is None:
            raise ValueError(f"{self.name}: {size} is not on its ladder {self.sizes}")
        return self.resize(size)

    def missing(self, device: torch.device) -> str | None:
        """Why this workload cannot run on ``device``, or None."""
        return self.unavailable(device) if self.unavailable is not None else None

    def pair(self, device: torch.device, dtype: torch.dtype) -> tuple[Fn, Fn]:
        """(baseline, AMP path): the two functions timed interleaved; the speedup is their ratio."""
        base = self.baseline(device, dtype) if self.baseline is not None else self.make(device, None)
        return base, self.make(device, dtype)
