"""AMP-vs-fp32 speed measured as a ratio in one run, interleaved, with a variance gate.

Timing uses ``torch.utils.benchmark.Timer`` on the CPU and CUDA events (after a synchronise) on
CUDA; fp32 and AMP alternate round by round (A B A B ...) so drift of the machine hits both, and
the speedup is the median of the per-round ratios.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Fn = Callable[[], Any]

#: The smallest AMP slowdown the speed gate must catch (the qualification requirement: a 1.3x
#: slower AMP path fails). Thresholds are placed between it and the calibration runs.
DETECT_SLOWDOWN = 1.3


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

    def pair(self, device: torch.device, dtype: torch.dtype) -> tuple[Fn, Fn]:
        """(baseline, AMP path): the two functions timed interleaved; the speedup is their ratio."""
        base = self.baseline(device, dtype) if self.baseline is not None else self.make(device, None)
        return base, self.make(device, dtype)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _matmul(n: int) -> Callable[[torch.device, torch.dtype | None], Fn]:
    def make(device: torch.device, dtype: torch.dtype | None) -> Fn:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g).to(device), torch.randn(n, n, generator=g).to(device)

        def run() -> Any:
            with _autocast(device, dtype):
                return a @ b

        return run

    return make


def _linear_fwd_bwd(device: torch.device, dtype: torch.dtype | None) -> Fn:
    torch.manual_seed(0)
    layer = torch.nn.Linear(1024, 1024).to(device)
    x = torch.randn(256, 1024, device=device)

    def run() -> Any:
        with _autocast(device, dtype):
            y = layer(x)
        y.float().sum().backward()

    return run


def _sdpa(device: torch.device, dtype: torch.dtype | None) -> Fn:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 256, 64, generator=g).to(device) for _ in range(3))

    def run() -> Any:
        with _autocast(device, dtype):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


def _layer_norm(device: torch.device, dtype: torch.dtype | None) -> Fn:
    x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0)).to(device)
    ln = torch.nn.LayerNorm(1024).to(device)

    def run() -> Any:
        with _autocast(device, dtype):
            return ln(x)

    return run


def _lm_step(device: torch.device, dtype: torch.dtype | None) -> Fn:
    from harness.domains import training as T

    setup = T.SETUPS["tiny_lm"]
    model = setup.model(0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = setup.batch(0, torch.Generator().manual_seed(0))
    x, y = x.to(device), y.to(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)

    def run() -> Any:
        opt.zero_grad()
        with _autocast(device, dtype):
            loss = setup.loss_from(setup.forward(model, x), y)
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scaler.step(opt)
        scaler.update()

    return run


def _mm_flops(n: int) -> float:
    return 2.0 * n**3


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("matmul_256", _matmul(256), _mm_flops(256)),
        Workload("matmul_512", _matmul(512), _mm_flops(512)),
        Workload("matmul_1024", _matmul(1024), _mm_flops(1024)),
        Workload("linear_fwd_bwd", _linear_fwd_bwd, 3 * 2.0 * 256 * 1024 * 1024),
        Workload("sdpa", _sdpa, 2 * 2.0 * 2 * 8 * 256 * 256 * 64),
        Workload("layer_norm", _layer_norm, None, autocast_op="nn.LayerNorm"),
        Workload("lm_train_step", _lm_step, None),
    )
}


@dataclass(frozen=True)
class Timing:
    """Per-round seconds per iteration of fp32 and AMP, interleaved."""

    fp32_s: tuple[float, ...]
    amp_s: tuple[float, ...]

    @property
    def ratios(self) -> list[float]:
        return [a / b for a, b in zip(self.fp32_s, self.amp_s, strict=True)]

    @property
    def speedup(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> float:
        """Interquartile range of the per-round speedups (absolute, in speedup units)."""
        r = self.ratios
        if len(r) < 4:
            return max(r) - min(r)
        q = statistics.quantiles(r, n=4)
        return q[2] - q[0]

    @property
    def amp_median_s(self) -> float:
        return statistics.median(self.amp_s)

    @property
    def fp32_median_s(self) -> float:
        return statistics.median(self.fp32_s)


def _time_block(fn: Fn, device: torch.device, number: int) -> float:
    """Seconds per iteration of ``number`` iterations."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(number):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) / 1000.0 / number
    from torch.utils.benchmark import Timer

    # One thread (Timer's default, and CPU_THREADS): on a shared 2-core VM two threads scatter the
    # speedup about twice as much (IQR 0.46 against 0.2 for bf16 matmul 1024, measured).
    return float(Timer("fn()", globals={"fn": fn}, num_threads=CPU_THREADS).timeit(number).mean)


#: CPU timings run on this many threads, in calibration and in the suite alike.
CPU_THREADS = 1

#: Target duration of one timed block: long against timer resolution and Python overhead (~us),
#: short enough that several interleaved rounds fit the suite's budget.
BLOCK_S = 0.02


@contextlib.contextmanager
def timing_threads(device: torch.device) -> Iterator[None]:
    """On the CPU, torch runs on CPU_THREADS inside (what every timed block runs on); the thread
    count before comes back after. Nothing changes on CUDA."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _warm_up(fp32: Fn, amp: Fn, device: torch.device, warmup: int, number: int | None = None) -> int:
    """Run both ``warmup`` times; the iterations per timed block (enough for BLOCK_S of the slower
    one, unless ``number`` is given). On the CPU the warm-up runs on the timing's CPU_THREADS: a
    compiled function is specialised to the thread count (Dynamo guards on it), so warming it up on
    another count would leave its recompilation inside the first timed block."""
    with timing_threads(device):
        for _ in range(warmup):
            fp32()
            amp()
    if number is not None:
        return number
    slowest = max(_time_block(fp32, device, 1), _time_block(amp, device, 1))
    return max(1, round(BLOCK_S / slowest))


def interleaved(
    fp32: Fn, amp: Fn, device: torch.device, rounds: int, number: int | None = None, warmup: int = 2
) -> Timing:
    """Warm both up, then time fp32 and AMP alternately, ``rounds`` times; ``number`` iterations per
    block (default: enough for BLOCK_S of the slower one)."""
    number = _warm_up(fp32, amp, device, warmup, number)
    a, b = [], []
    for _ in range(rounds):
        a.append(_time_block(fp32, device, number))
        b.append(_time_block(amp, device, number))
    return Timing(tuple(a), tuple(b))


#: ``pedantic(target, setup, rounds) -> seconds of each round of target``: pytest-benchmark's
#: pedantic runner, handed in by the suite (the domain never imports a pytest plugin).
Pedantic = Callable[[Fn, Fn, int], list[float]]


def interleaved_pedantic(
    fp32: Fn, amp: Fn, device: torch.device, rounds: int, pedantic: Pedantic, warmup: int = 2
) -> Timing:
    """As :func:`interleaved`, with the AMP blocks timed by pytest-benchmark: each round's fp32
    block runs (timed here) in the runner's untimed ``setup``, then the AMP block is the timed
    target, so the rounds still alternate fp32, AMP, fp32, AMP ... and the judged figure is the
    same median ratio. A block is ``number`` iterations (pedantic allows one iteration per round
    with a setup), synchronised on CUDA."""
    number = _warm_up(fp32, amp, device, warmup)
    fp32_s: list[float] = []

    def setup() -> None:
        fp32_s.append(_time_block(fp32, device, number))

    def target() -> None:
        with timing_threads(device):  # as _time_block times the fp32 blocks
            for _ in range(number):
                amp()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    amp_block_s = pedantic(target, setup, rounds)
    if len(amp_block_s) != len(fp32_s) or not amp_block_s:
        raise RuntimeError(f"pytest-benchmark timed {len(amp_block_s)} rounds for {len(fp32_s)} fp32 blocks")
    return Timing(tuple(fp32_s), tuple(s / number for s in amp_block_s))


def is_noisy(timing: Timing, threshold: float | None) -> bool:
    """Too noisy for the threshold to mean anything: the run's own spread reaches from its median
    across the threshold (the verdict could flip within the measurement's variation)."""
    if threshold is None:
        return False
    return abs(timing.speedup - threshold) < timing.spread


def slowed(fn: Fn, factor: float, seconds_per_call: float, device: torch.device | None = None) -> Fn:
    """``fn`` made ``factor`` times slower by busy-waiting (for the harness's negative controls).

    On the CPU each call waits ``factor - 1`` times its own duration, so the path is exactly
    ``factor`` times slower whatever the machine's speed does meanwhile (a fixed wait sized from a
    probe was a smaller slowdown whenever the path ran slower than during the probe, and a
    slowed path then passed). On CUDA, where a call returns before its kernels finish, the wait is
    ``factor - 1`` times ``seconds_per_call``, the synchronised median of a probe.
    """
    import time

    extra = (factor - 1.0) * seconds_per_call
    per_call = device is None or device.type == "cpu"

    def run() -> Any:
        start = time.perf_counter()
        out = fn()
        now = time.perf_counter()
        end = now + ((factor - 1.0) * (now - start) if per_call else extra)
        while time.perf_counter() < end:
            pass
        return out

    return run
