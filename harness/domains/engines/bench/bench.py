"""AMP-vs-fp32 speed measured as a ratio in one run, interleaved, with a variance gate.

On the CPU a block is timed by the timing thread's CPU time (and by wall clock, recorded beside
it), on CUDA by CUDA events after a synchronise; fp32 and AMP alternate round by round (A B A B
...) so drift of the machine hits both; the speedup is the median of the per-round ratios, judged
with its distribution-free confidence interval, and rounds continue until that interval is narrow
or a time cap is reached (:class:`Rounds`). On the CPU a fixed low-precision matmul (the
contention probe) is timed in every round too: a round whose probe ran far slower than at
calibration shared the core's matrix units with another tenant of the host and is not judged
(:data:`CONTENDED`).
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.engines.bench.inject import slowed
from harness.domains.engines.bench.workload import Fn, Workload
from harness.numerics.order_statistics import CONFIDENCE, median_interval, smallest_confident_n
from harness.platform.host import other_processes_load

__all__ = [  # the workload type, the order statistics and the fault, re-exported: one import for callers
    "CONFIDENCE",
    "Fn",
    "Workload",
    "median_interval",
    "other_processes_load",
    "slowed",
]

#: The smallest AMP slowdown the speed gate must catch (the qualification requirement: a 1.3x
#: slower AMP path fails). Thresholds are placed between it and the calibration runs.
DETECT_SLOWDOWN = 1.3


#: The clock a CPU speedup is judged by: the timing thread's own CPU time (CLOCK_THREAD_CPUTIME_ID).
#: On a shared machine other processes preempt the timing thread; wall clock counts the time it
#: waits and this clock does not (docs/hardware-and-speed.md has the figures). On CUDA the clock is
#: CUDA events after a synchronise, where wall time is the right measure of a GPU's work.
THREAD_CPU = "thread_cpu"
CUDA_EVENTS = "cuda_events"


@dataclass(frozen=True)
class Clocks:
    """The clocks a CPU block is read by: the judged one (the timing thread's CPU time) and wall
    clock. One object, so that the harness's own tests can hand in a broken clock (one that reads
    0, one that goes backwards) and show that a measurement still ends, NOT JUDGED."""

    judged: Callable[[], float] = time.thread_time
    wall: Callable[[], float] = time.perf_counter


CLOCKS = Clocks()

#: The clock every cap is read by: monotonic, and never the clocks a measurement is judged by, so
#: that a judged clock that stops or runs backwards cannot stretch a measurement without end.
CAP_CLOCK = time.monotonic


class Capped(Exception):
    """A measurement stopped at one of its caps, or read a clock it cannot trust: the speedup is
    NOT JUDGED, and the message names the cap (or the clock) and what was measured."""


#: Fewest interleaved rounds of a measurement: the smallest n whose median interval has the stated
#: CONFIDENCE (6: [min, max] of 6 rounds holds the median with probability 1 - 2/64 = 96.9%).
MIN_ROUNDS = smallest_confident_n(CONFIDENCE)

#: A measurement stops once its interval is this narrow (hi / lo): a quarter of the DETECT_SLOWDOWN
#: gap on a log scale, so an interval that holds a clean speedup cannot also reach a 1.3x slower one.
TARGET_WIDTH = DETECT_SLOWDOWN**0.25

#: ... or once its rounds have taken this long (seconds of wall clock), whichever is first: the cap
#: that keeps a case on a busy machine within the suite's time budget (then it is judged on the
#: interval it has, NOISY if that holds the threshold).
MAX_MEASURE_S = 2.0


#: Side of the contention probe's square low-precision matmul (inputs already in the AMP dtype, no
#: autocast: the matrix units alone): the smallest at which contended and uncontended rounds stood
#: apart on a kind with matrix units (docs/hardware-and-speed.md).
PROBE_N = 512

#: A round whose probe ran more than this many times slower than the class's calibrated probe time
#: (:attr:`Timing.probe_ref_s`) was contended and is not judged: DETECT_SLOWDOWN times the scatter a
#: calibration run may have (sqrt(DETECT_SLOWDOWN)), so a 1.3x slower low-precision matmul kernel
#: (the probe's own kind, slowed by a release) still leaves its rounds judged and fails. Contended
#: rounds fall into a mode of their own that no threshold survives, and nothing in this VM's
#: /proc/stat shows it: other tenants of the host share the physical core (the measured modes are
#: in docs/hardware-and-speed.md).
CONTENDED = DETECT_SLOWDOWN * DETECT_SLOWDOWN**0.5

#: Judged rounds whose probe ran, by their median, more than this many times *faster* than the
#: calibrated probe time come from a quieter host than the calibration had: the class was calibrated
#: while contended and its threshold (median / sqrt(DETECT_SLOWDOWN)) is a contended machine's. The
#: bound is that threshold's own margin: contention slows the AMP path's low-precision matmuls at most
#: as much as the probe (the same kernel) and fp32 no less than not at all, so a host quieter by less
#: than sqrt(DETECT_SLOWDOWN) raises the speedup by less than the margin, and a 1.3x slower path still
#: falls below the threshold. The 1/CONTENDED bound this rule used to share let a slowed path pass
#: (docs/hardware-and-speed.md).
QUIETER = DETECT_SLOWDOWN**0.5

#: Judged rounds whose baseline ran, by its median, more than this many times *slower* than the
#: class's calibrated baseline time (:attr:`Threshold.baseline_s`) were slowed by something outside
#: the AMP path, and a speedup above the threshold is then no pass: contention that slows the
#: baseline ``c`` times and the AMP path less raises the speedup by up to ``c``, and a
#: DETECT_SLOWDOWN slower path passes once ``c`` reaches the threshold's margin, sqrt(DETECT_SLOWDOWN).
#: The contention probe cannot see it: it times the AMP dtype's kernel, and on the AVX2 kind the
#: fp32 baseline of fp16 matmul 256 ran in a mode 1.13-1.2x slower in some processes while the
#: emulated fp16 path kept its speed; a 1.3x slower path then passed (docs/hardware-and-speed.md).
BASELINE_SLOWED = DETECT_SLOWDOWN**0.5

#: The share of a calibration's rounds (every case of one dtype) whose probe time is the class's
#: uncontended probe time (their 5th percentile): contention only adds time, so the fastest rounds
#: are the uncontended speed, and a twentieth of a calibration's rounds is tens of rounds, not one
#: fluke.
PROBE_REF_QUANTILE = 0.05


#: The dtypes the probe runs in: autocast's low-precision dtypes, whose CPU matmuls use the matrix
#: and vector units a neighbour contends for. A float8 matmul on the CPU is a reference path (1 s
#: for one 512 probe): no probe there.
PROBE_DTYPES = (torch.bfloat16, torch.float16)


def probes(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a contention probe runs for ``dtype`` on ``device`` (see :func:`contention_probe`)."""
    return device.type == "cpu" and dtype in PROBE_DTYPES


def contention_probe(device: torch.device, dtype: torch.dtype, n: int | None = None) -> Fn | None:
    """The contention probe (an ``n`` square matmul in ``dtype``, PROBE_N by default) on the CPU;
    None on CUDA, where the clock is the GPU's own and a VM's neighbours do not share its matrix
    units, and for a dtype outside PROBE_DTYPES."""
    if not probes(device, dtype):
        return None
    side = n or PROBE_N
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randn(side, side, generator=g).to(dtype) for _ in range(2))

    def run() -> Any:
        return a @ b

    return run


#: The probe's sides, largest first. A calibration takes the largest whose call fits PROBE_CALL_S
#: and stores it with the class's thresholds (the suite times the same probe). Where bf16 and fp16
#: have matrix units or native instructions, PROBE_N fits; where they are emulated (AVX2-only CPUs)
#: a PROBE_N probe costs more than most cases it watches, every round, and a smaller one still keeps
#: the vector units busy for milliseconds.
PROBE_SIDES = (PROBE_N, PROBE_N // 2, PROBE_N // 4, PROBE_N // 8)


def probe_side(device: torch.device, dtype: torch.dtype) -> int | None:
    """The side of the probe a calibration of ``dtype`` uses here: the largest of PROBE_SIDES whose
    warm call took at most PROBE_CALL_S (the smallest where none did); None where no probe runs."""
    if not probes(device, dtype):
        return None
    for side in PROBE_SIDES:
        probe = contention_probe(device, dtype, side)
        assert probe is not None
        with timing_threads(device):
            probe()
            if call_s(probe, device) <= PROBE_CALL_S:
                return side
    return PROBE_SIDES[-1]


def probe_reference(probe_s: list[float]) -> float | None:
    """The uncontended probe time: the PROBE_REF_QUANTILE quantile of calibration rounds' probe
    seconds (None without any)."""
    if not probe_s:
        return None
    xs = sorted(probe_s)
    return xs[min(len(xs) - 1, int(PROBE_REF_QUANTILE * len(xs)))]


@dataclass(frozen=True)
class Timing:
    """Per-round seconds per iteration of the baseline (``fp32_s``) and the AMP path, interleaved,
    by the judging ``clock``; the same blocks by wall clock; the first call of each path (its
    warm-up, where a compiled path traces and compiles); why the rounds stopped; per round, the
    contention probe's seconds per iteration, and the calibrated probe time it is judged against
    (rounds contended beyond CONTENDED are taken but not judged, unless the baseline of the same
    rounds ran at its calibrated speed: :attr:`slow_kernel`)."""

    fp32_s: tuple[float, ...]
    amp_s: tuple[float, ...]
    clock: str = THREAD_CPU
    fp32_wall_s: tuple[float, ...] = ()
    amp_wall_s: tuple[float, ...] = ()
    #: wall seconds of the first call of (baseline, AMP path), when measured
    first_call_s: tuple[float, float] | None = None
    stopped: str = "fixed number of rounds"
    #: CPU cores other processes of the machine kept busy, on average, while the rounds ran (CPU
    #: only, where /proc/stat exists; :func:`other_processes_load`)
    other_load: float | None = None
    #: the contention probe's seconds per iteration, one per round (empty: no probe, as on CUDA)
    probe_s: tuple[float, ...] = ()
    #: the class's calibrated uncontended probe time (None: no round is dropped)
    probe_ref_s: float | None = None
    #: the class's calibrated baseline seconds per iteration (``Threshold.baseline_s``; None: every
    #: round whose probe ran over CONTENDED is taken for contention, as before it was stored)
    baseline_ref_s: float | None = None

    def _probe_slowed(self) -> list[int]:
        """Rounds whose probe ran over CONTENDED times its calibrated time (none without both)."""
        if self.probe_ref_s is None or not self.probe_s:
            return []
        limit = self.probe_ref_s * CONTENDED
        return [i for i, p in enumerate(self.probe_s) if p > limit]

    @property
    def slow_kernel(self) -> tuple[float, float] | None:
        """(probe, baseline) medians over their calibrated times in the rounds whose probe ran over
        CONTENDED, when the baseline of those same rounds ran within BASELINE_SLOWED of its own
        calibrated time; None otherwise. A neighbour on the core slows the fp32 baseline too (1.3x
        while the probe slowed 2x, on the Intel kind with AMX), a low-precision kernel that
        regressed slows the probe alone: the probe is the same kind of kernel as the AMP path's, so
        without this a kernel more than CONTENDED slower read as contention and was never judged."""
        slowed = self._probe_slowed()
        if not slowed or self.baseline_ref_s is None or self.baseline_ref_s <= 0 or self.probe_ref_s is None:
            return None
        baseline = statistics.median(self.fp32_s[i] for i in slowed) / self.baseline_ref_s
        if baseline > BASELINE_SLOWED:
            return None
        return statistics.median(self.probe_s[i] for i in slowed) / self.probe_ref_s, baseline

    @property
    def kept(self) -> list[int]:
        """Indices of the judged rounds: those whose probe ran within CONTENDED of the reference;
        every round where the probe's slowness is the kernel's own (:attr:`slow_kernel`)."""
        slowed = self._probe_slowed()
        if not slowed or self.slow_kernel is not None:
            return list(range(len(self.fp32_s)))
        dropped = set(slowed)
        return [i for i in range(len(self.fp32_s)) if i not in dropped]

    @property
    def taken(self) -> int:
        """Rounds taken, judged or not."""
        return len(self.fp32_s)

    @property
    def rounds(self) -> int:
        """Rounds judged (taken, less the contended)."""
        return len(self.kept)

    @property
    def contended(self) -> int:
        return self.taken - self.rounds

    @property
    def contention(self) -> float | None:
        """The probe's median time over its calibrated time (None without both)."""
        if self.probe_ref_s is None or not self.probe_s:
            return None
        return statistics.median(self.probe_s) / self.probe_ref_s

    @property
    def judged_contention(self) -> float:
        """The probe's median time over its calibrated time in the judged rounds (1.0 without a
        probe and a reference): how quiet the rounds the speedup comes from were."""
        if self.probe_ref_s is None or not self.probe_s:
            return 1.0
        kept = self.kept
        if not kept:
            return math.inf
        return statistics.median(self.probe_s[i] for i in kept) / self.probe_ref_s

    def _ratios(self, rounds: list[int]) -> list[float]:
        return [self.fp32_s[i] / self.amp_s[i] for i in rounds]

    @property
    def ratios(self) -> list[float]:
        return self._ratios(self.kept)

    def _reported(self) -> list[int]:
        """The rounds the figures come from: the judged ones; all where every round was contended
        (then the figures are reported, and the interval is unbounded)."""
        return self.kept or list(range(self.taken))

    def _figures(self) -> list[float]:
        return self._ratios(self._reported())

    @property
    def speedup(self) -> float:
        """The judged figure: the median of the judged rounds' ratios, by the judging clock."""
        return statistics.median(self._figures())

    @property
    def interval(self) -> tuple[float, float]:
        """CONFIDENCE interval of the speedup (:func:`median_interval` of the judged rounds' ratios)."""
        return median_interval(self.ratios) if self.ratios else (0.0, math.inf)

    @property
    def width(self) -> float:
        lo, hi = self.interval
        return hi / lo if lo > 0 else math.inf

    @property
    def wall_speedup(self) -> float | None:
        """The same median by wall clock (None where only one clock was read, or it is the judged one)."""
        if not self.fp32_wall_s:
            return None
        return statistics.median(self.fp32_wall_s[i] / self.amp_wall_s[i] for i in self._reported())

    @property
    def spread(self) -> float:
        """Interquartile range of the per-round speedups (absolute, in speedup units)."""
        r = self._figures()
        if len(r) < 4:
            return max(r) - min(r)
        q = statistics.quantiles(r, n=4)
        return q[2] - q[0]

    @property
    def amp_median_s(self) -> float:
        return statistics.median(self.amp_s[i] for i in self._reported())

    @property
    def fp32_median_s(self) -> float:
        return statistics.median(self.fp32_s[i] for i in self._reported())

    def describe(self) -> str:
        lo, hi = self.interval
        wall = self.wall_speedup
        by_wall = f"; by wall clock {wall:.3g}x" if wall is not None else ""
        load = f"; other processes kept {self.other_load:.2g} cores busy" if self.other_load is not None else ""
        dropped = (
            f", {self.contended} more not judged (contention probe over {CONTENDED:.3g}x its calibrated time)"
            if self.contended
            else ""
        )
        if self.probe_s:
            dropped += f"; probe median {statistics.median(self.probe_s) * 1e3:.3g} ms"
        kernel = self.slow_kernel
        if kernel is not None:
            dropped += (
                f"; the contention probe (a low-precision matmul) ran {kernel[0]:.3g}x its calibrated time while the "
                f"fp32 baseline of the same rounds ran at {kernel[1]:.3g}x its own: the low-precision kernel itself is "
                "slower, not the host, so those rounds are judged"
            )
        return (
            f"speedup {self.speedup:.3g}x by {self.clock}, {CONFIDENCE:.0%} interval [{lo:.3g}, {hi:.3g}] "
            f"over {self.rounds} rounds{dropped} ({self.stopped}){by_wall}{load}"
        )


def _time_block(fn: Fn, device: torch.device, number: int) -> tuple[float, float]:
    """(judged seconds, wall seconds) per iteration of ``number`` iterations: on CUDA both are CUDA
    events after a synchronise; on the CPU the timing thread's CPU time and wall clock of the same
    block (:data:`CLOCKS`), on CPU_THREADS threads (torch's intra-op work then runs on this thread,
    so its CPU time is the work's). ``torch.utils.benchmark.Timer`` reads one clock per block; both
    are read here. A block of several iterations that runs past BLOCK_CAP_S stops, :class:`Capped`;
    a clock that read no time or went backwards over a block is :class:`Capped` too."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(number):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        s = float(start.elapsed_time(end)) / 1000.0 / number
        return s, s
    clocks = CLOCKS
    gc_was_on = gc.isenabled()
    gc.disable()  # as timeit does: a collection inside one block only is noise
    done = number
    try:
        with timing_threads(device):
            cap_at = CAP_CLOCK() + BLOCK_CAP_S
            w0, c0 = clocks.wall(), clocks.judged()
            if number == 1:
                fn()
            else:
                for i in range(number):
                    fn()
                    if CAP_CLOCK() > cap_at:  # ~50 ns a call, beside calls of tens of microseconds
                        done = i + 1
                        break
            c1, w1 = clocks.judged(), clocks.wall()
    finally:
        if gc_was_on:
            gc.enable()
    if done < number:
        raise Capped(
            f"a timed block of {number} calls ran past its cap of {BLOCK_CAP_S:g} s (50 x the {BLOCK_S:g} s it was "
            f"sized for) after {done} calls: the calls became far slower than when the block was sized"
        )
    judged, wall = c1 - c0, w1 - w0
    if judged <= 0 or wall <= 0:
        raise Capped(
            f"the clocks read {judged:.3g} s ({clocks.judged.__name__}) and {wall:.3g} s (wall) over a block of "
            f"{number} calls: a clock that reads no time or goes backwards times nothing"
        )
    return judged / number, wall / number


def clock_of(device: torch.device) -> str:
    return CUDA_EVENTS if device.type == "cuda" else THREAD_CPU


#: CPU timings run on this many threads, in calibration and in the suite alike. One: on a shared
#: 2-core machine two threads scatter the speedup about twice as much, and with one thread the
#: timing thread's CPU time is all of the work's.
CPU_THREADS = 1

#: Target duration of one timed block: long against timer resolution and Python overhead (~us),
#: short enough that several interleaved rounds fit the suite's budget.
BLOCK_S = 0.02

#: A block's iteration count comes from a sizing block of at least this long (doubling and
#: quintupling the count, as ``timeit.Timer.autorange`` does), never from one call: a quarter of a
#: block, several milliseconds, long against the clocks' resolution and a call's own scatter.
SIZING_S = BLOCK_S / 4

#: A block of several iterations stops, and its measurement is NOT JUDGED, past this many times its
#: target BLOCK_S: it was sized from a sizing block SIZING_S or longer, so only calls that became
#: fifty times slower than they were a moment before reach it (the worst contended mode measured
#: on these kinds slowed a block about 3x: docs/hardware-and-speed.md). A block of one call cannot
#: be cut: the case's cap bounds it.
BLOCK_CAP_S = 50 * BLOCK_S

#: A case's warm-up (beyond each path's first call, where a compiled path compiles: the test's time
#: limit bounds that) and rounds together stop past this, NOT JUDGED: ten times the 6 s a judged
#: case may take in the default tier (calibration.CASE_BUDGET_S), which the slowest case on the
#: slowest kind (bf16 matmul 1024 where bf16 is emulated, about 9 s for its rounds) stays far under.
CASE_CAP_S = 60.0


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


def call_s(fn: Fn, device: torch.device) -> float:
    """Seconds of one warm call by the cap clock: an estimate that sizes blocks and rounds, never a
    judged figure (a coarse judged clock may read a call of a millisecond as no time at all)."""
    start = CAP_CLOCK()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return CAP_CLOCK() - start


def _first_call(fn: Fn, device: torch.device) -> float:
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _warm_up(
    fp32: Fn, amp: Fn, device: torch.device, warmup: int, number: int | None = None
) -> tuple[tuple[int, int], tuple[float, float], tuple[float, float]]:
    """Run both ``warmup`` times (the first call of each timed: a compiled path traces and compiles
    in it); return the iterations per timed block of each path (enough for BLOCK_S of that path,
    unless ``number`` is given: a fast path beside a 26x slower one would otherwise be timed in
    blocks of a millisecond, where overheads and cache state scatter it), the first calls'
    seconds, and a warm call's seconds of each (the first call's with one warm-up call). On the
    CPU the warm-up runs on the timing's CPU_THREADS: a compiled function is specialised to the thread count (Dynamo guards on it), so warming it up on another count would
    leave its recompilation inside the first timed block."""
    later: tuple[list[float], list[float]] = ([], [])
    with timing_threads(device):
        first = (_first_call(fp32, device), _first_call(amp, device))
        for _ in range(warmup - 1):
            later[0].append(call_s(fp32, device))
            later[1].append(call_s(amp, device))
    # with one warm-up call (an eager path measured for no verdict) the first call is the estimate
    warm = (min(later[0], default=first[0]), min(later[1], default=first[1]))
    if number is not None:
        return (number, number), first, warm

    return (
        (_iterations(fp32, device, BLOCK_S, warm[0]), _iterations(amp, device, BLOCK_S, warm[1])),
        first,
        warm,
    )


def _iterations(fn: Fn, device: torch.device, block_s: float, warm_s: float | None = None) -> int:
    """Iterations of ``fn`` (warmed up) that fill about ``block_s`` seconds of a timed block.
    ``warm_s``: a warm call's seconds already timed; a call that alone fills the block is not
    timed again (on the AVX2 kind one bf16 matmul 1024 takes seconds).

    Sized as ``timeit.Timer.autorange`` does, by the cap clock (monotonic, which no judged clock's
    fault can stop): 1, 2, 5, 10, 20, 50 ... calls until a sizing block lasts SIZING_S, then scaled
    to ``block_s``. Never from one call: a call that a coarse or faulty clock reads as no time
    would otherwise make a block of millions of calls."""
    if warm_s is not None and warm_s >= block_s:
        return 1
    number = 1
    with timing_threads(device):
        while True:
            for step in (1, 2, 5):
                n = number * step
                start = CAP_CLOCK()
                for _ in range(n):
                    fn()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                took = CAP_CLOCK() - start
                if took >= min(SIZING_S, block_s):
                    return max(1, round(n * block_s / took))
            number *= 10


@dataclass(frozen=True)
class Rounds:
    """How many interleaved rounds a measurement takes: at least ``least``; then until the speedup's
    interval is ``target_width`` narrow, ``max_s`` seconds have passed, or ``most`` rounds ran."""

    least: int = MIN_ROUNDS
    most: int = 200
    target_width: float = TARGET_WIDTH
    max_s: float = MAX_MEASURE_S

    @classmethod
    def fixed(cls, n: int) -> Rounds:
        return cls(least=n, most=n, target_width=math.inf, max_s=math.inf)

    #: take as many rounds as the warm-up says fit ``max_s`` (at least one, at most ``most``)
    fit: bool = False

    @classmethod
    def unjudged(cls) -> Rounds:
        """A speedup nothing is judged against: MIN_ROUNDS rounds where the warm-up says they fit the
        time cap, fewer (at least one) where they do not: a path that takes seconds a call, as bf16
        does where it is emulated."""
        return cls(least=MIN_ROUNDS, most=MIN_ROUNDS, fit=True)

    def fitted(self, round_s: float) -> Rounds:
        """These rounds for a round of ``round_s`` seconds (as the warm-up timed it): with ``fit``, a
        fixed number that fits ``max_s``; unchanged otherwise."""
        if not self.fit:
            return self
        n = max(1, min(self.most, int(self.max_s // max(round_s, 1e-9))))
        return Rounds.fixed(n)

    def stop(self, t: Timing, elapsed_s: float) -> str | None:
        """Why to stop after ``t``'s rounds, or None to go on. Contended rounds count towards the
        round limit and the time cap, never towards ``least`` or the interval."""
        if t.taken < self.least:
            return None
        if t.taken >= self.most:
            return "fixed number of rounds" if self.least == self.most else f"round limit {self.most}"
        if t.rounds >= self.least and t.width <= self.target_width:
            return f"interval within {self.target_width:.3g}x"
        if elapsed_s >= self.max_s:
            return f"time cap {self.max_s:g} s"
        return None


#: ``pedantic(target, setup, rounds) -> seconds of each round of target``: pytest-benchmark's
#: pedantic runner, handed in by the suite (the domain never imports a pytest plugin).
Pedantic = Callable[[Fn, Fn, int], list[float]]


def interleaved(
    fp32: Fn,
    amp: Fn,
    device: torch.device,
    rounds: Rounds | int | None = None,
    number: int | None = None,
    warmup: int = 2,
    pedantic: Pedantic | None = None,
    probe: Fn | None = None,
    probe_ref_s: float | None = None,
    baseline_ref_s: float | None = None,
) -> Timing:
    """Warm both up, then time the baseline and AMP alternately (fp32, AMP, fp32, AMP ...), as many
    rounds as ``rounds`` says (default: adaptive, :class:`Rounds`); ``number`` iterations per block
    (default: enough for BLOCK_S of each path). With a ``probe`` (:func:`contention_probe`), each
    round times it between the two blocks, PROBE_BLOCK_S of it; rounds whose probe ran over
    CONTENDED times ``probe_ref_s`` are taken but not judged, unless their baseline ran within
    BASELINE_SLOWED of ``baseline_ref_s`` (:attr:`Timing.slow_kernel`).

    With ``pedantic`` (pytest-benchmark), the first ``rounds.least`` AMP blocks are pytest-benchmark's
    result: each round's baseline block runs in its untimed ``setup`` and the AMP block is its timed
    target, so the rounds still alternate; further rounds, when the interval asks for them, are
    timed here alone. The judged figure is the same either way: both clocks of every block are
    read here."""
    policy = rounds if isinstance(rounds, Rounds) else Rounds() if rounds is None else Rounds.fixed(rounds)
    began = CAP_CLOCK()
    (n_base, n_amp), first, warm = _warm_up(fp32, amp, device, warmup, number)
    # the case's cap counts from its start, less each path's first call (a compile: the test's
    # time limit bounds that)
    cap_at = began + sum(first) + CASE_CAP_S
    policy = policy.fitted(n_base * warm[0] + n_amp * warm[1])
    n_probe = _probe_iterations(probe, device) if probe is not None else 0
    base_j: list[float] = []
    amp_j: list[float] = []
    base_w: list[float] = []
    amp_w: list[float] = []
    probe_j: list[float] = []

    watch = other_processes_load() if device.type != "cuda" else None

    def timing(stopped: str = "") -> Timing:
        load = watch() if watch is not None else None
        return Timing(
            tuple(base_j),
            tuple(amp_j),
            clock_of(device),
            tuple(base_w),
            tuple(amp_w),
            first,
            stopped,
            load,
            tuple(probe_j),
            probe_ref_s if probe is not None else None,
            baseline_ref_s if probe is not None else None,
        )

    def time_base() -> None:
        j, w = _time_block(fp32, device, n_base)
        base_j.append(j)
        base_w.append(w)
        if probe is not None:
            with timing_threads(device):
                probe()  # untimed: its inputs back in cache after the workload's block evicted them
            probe_j.append(_time_block(probe, device, n_probe)[0])

    def time_amp() -> None:
        j, w = _time_block(amp, device, n_amp)
        amp_j.append(j)
        amp_w.append(w)

    start = CAP_CLOCK()
    if pedantic is not None:
        benchmarked = pedantic(time_amp, time_base, policy.least)
        if len(benchmarked) != len(base_j) or len(amp_j) != len(base_j) or not base_j:
            raise RuntimeError(f"pytest-benchmark timed {len(benchmarked)} rounds for {len(base_j)} fp32 blocks")
    while True:
        if base_j:
            stopped = policy.stop(timing(), CAP_CLOCK() - start)
            if stopped is not None:
                return timing(stopped)
        if CAP_CLOCK() > cap_at:
            raise Capped(
                f"the case ran past its cap of {CASE_CAP_S:g} s (warm-up and {len(base_j)} rounds, first calls aside) "
                "before its rounds were done"
            )
        time_base()
        time_amp()


def measure(
    workload: Workload,
    device: torch.device,
    dtype: torch.dtype,
    slowdown: float = 1.0,
    rounds: Rounds | int | None = None,
    pedantic: Pedantic | None = None,
    probe_ref_s: float | None = None,
    probe: bool = True,
    probe_side: int | None = None,
    warmup: int = 2,
    baseline_ref_s: float | None = None,
) -> Timing:
    """A workload's AMP speedup over its baseline on ``device``: the one measurement that
    ``amp-harness calibrate`` and the speed checks both make. ``slowdown`` slows the AMP path by
    that factor (the harness's negative controls); ``probe_ref_s`` is the class's calibrated
    contention-probe time (rounds contended beyond CONTENDED of it are not judged); ``probe``:
    False leaves the probe out (an unjudged speedup: no reference to read it against);
    ``probe_side``: the calibrated probe's side (PROBE_N where None); ``warmup``: calls of each
    path before the rounds (one is enough for an eager path nothing is judged against);
    ``baseline_ref_s``: the class's calibrated baseline time, which tells a slower low-precision
    kernel from contention (:attr:`Timing.slow_kernel`)."""
    fp32, amp = workload.pair(device, dtype)
    if slowdown != 1.0:
        amp = slowed(amp, slowdown, _probe_s(amp, device), device)
    probe_fn = contention_probe(device, dtype, probe_side) if probe else None
    return interleaved(
        fp32,
        amp,
        device,
        rounds,
        warmup=warmup,
        pedantic=pedantic,
        probe=probe_fn,
        probe_ref_s=probe_ref_s,
        baseline_ref_s=baseline_ref_s,
    )


#: Target duration of the contention probe's block in a round: a quarter of a timed block, long
#: against the clock's resolution, and a small addition to each round.
PROBE_BLOCK_S = BLOCK_S / 4

#: The longest probe call a calibration chooses (:func:`probe_side`): four probe blocks, so a
#: round's probe stays a small part of a round even at one call per block.
PROBE_CALL_S = 4 * PROBE_BLOCK_S


def _probe_iterations(probe: Fn, device: torch.device) -> int:
    """Iterations of the probe's block (warmed up first, on the timing's threads), sized like every
    block: from a sizing block of several calls (:func:`_iterations`)."""
    with timing_threads(device):
        probe()
    return _iterations(probe, device, PROBE_BLOCK_S)


def _probe_s(fn: Fn, device: torch.device) -> float:
    """Median synchronised seconds of one call (what a slowed CUDA path waits per call)."""
    if device.type != "cuda":
        return 0.0  # a slowed CPU call waits in proportion to itself
    with timing_threads(device):
        fn()
        return statistics.median(_time_block(fn, device, 1)[0] for _ in range(5))


#: Other processes' load (CPU cores, averaged over a measurement) above which a CPU speedup below its
#: threshold is no verdict: half a core, between what an idle 2-core machine and one beside a
#: competing `pytest suites/` show, where a clean AMX path fell below its threshold
#: (docs/hardware-and-speed.md).
BUSY_OTHER_CORES = 0.5


def is_busy(timing: Timing) -> bool:
    """Other processes kept more than BUSY_OTHER_CORES cores busy while the rounds ran."""
    return timing.other_load is not None and timing.other_load > BUSY_OTHER_CORES


def is_noisy(timing: Timing, threshold: float | None) -> bool:
    """Too noisy for the threshold to mean anything: the speedup's CONFIDENCE interval holds it
    (the verdict could flip within the measurement's own uncertainty)."""
    if threshold is None:
        return False
    lo, hi = timing.interval
    return lo <= threshold <= hi
