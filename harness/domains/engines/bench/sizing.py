"""Workloads sized to the device: a speed case measures arithmetic, not kernel launches.

Sized for a 2-core CPU, a 512 matmul on an H200 is a launch and a synchronise: autocast measured
0.54x fp32 there, and a calibrated threshold then guarded that launch overhead, never the tensor
cores' speedup (docs/findings.md). Each laddered workload (:attr:`Workload.sizes`) is measured at
the smallest rung whose fp32 call takes at least COMPUTE_BOUND times the device's launch floor
(one trivial kernel launched and synchronised, measured once per device). On the CPU kinds the
first rung, today's size, already is: nothing changes there.

A device is described by :class:`DeviceSpeed` (measured, or simulated for the harness's own tests:
an H200's datasheet peaks and an assumed launch floor), which also says where the physics floor
applies: on a GPU whose matrix units run the AMP dtype, a compute-bound case slower than fp32 is a
regression whatever the class's calibration says.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from harness.domains.engines.bench.bench import CPU_THREADS, Capped, call_s, timing_threads
from harness.domains.engines.bench.workload import Workload
from harness.platform.hardware import detect_cpu
from harness.platform.peaks import cpu_frequency_hz, cpu_peaks

#: A rung is compute-bound when one fp32 call takes at least this many launch floors: launches and
#: synchronisation are then at most 1/20 = 5% of the call, so a DETECT_SLOWDOWN (1.3x) slower
#: arithmetic still moves the whole call by 1.3 x 0.95 + 0.05 = 1.285x.
COMPUTE_BOUND = 20.0
#: Calls of the launch floor's trivial kernel, whose median is the floor.
FLOOR_CALLS = 50
#: The largest rung measured while climbing: a call longer than this is compute-bound on any device
#: the harness meets, and a higher rung would only cost the suite's time (the CPU kinds' largest
#: default case, a 1024 matmul in emulated bf16, takes seconds; its fp32 baseline 30 ms).
MAX_RUNG_CALL_S = 1.0


@dataclass(frozen=True)
class DeviceSpeed:
    """What sizing and the physics floor need of a device, measured or simulated."""

    name: str
    device_type: str
    #: seconds of one trivial kernel launched and synchronised (the Python call on the CPU)
    launch_floor_s: float
    #: dense peak FLOP/s per dtype name (missing: unknown), and where they come from
    peaks: Mapping[str, float] = field(default_factory=dict)
    peak_origin: str = ""
    #: dtype names that run on matrix units faster than fp32 by design (a GPU's tensor cores)
    matrix_units: frozenset[str] = frozenset()
    #: a description the harness's tests make up: its times are modelled from the peaks
    simulated: bool = False

    def fraction(self, rate: float, dtype: str) -> float | None:
        peak = self.peaks.get(dtype)
        return rate / peak if peak else None

    def modelled_call_s(self, flops: float, dtype: str = "float32") -> float:
        """A call's seconds on a roofline: its FLOPs at the dtype's peak, plus the launch floor."""
        peak = self.peaks.get(dtype)
        if not peak:
            raise ValueError(f"{self.name}: no {dtype} peak to model a call's time with")
        return flops / peak + self.launch_floor_s


#: A simulated H200 for the harness's own tests: the datasheet's dense peaks (the fp32 one without
#: TF32, as the harness keeps fp32 matmuls at full precision) and an assumed launch-plus-synchronise
#: floor of 10 us (a real device's is measured: :func:`launch_floor`).
SIMULATED_H200 = DeviceSpeed(
    "NVIDIA H200 (simulated)",
    "cuda",
    10e-6,
    {"float32": 67e12, "bfloat16": 989.4e12, "float16": 989.4e12},
    "NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67 TFLOPS, BF16/FP16 Tensor Core 989 TFLOPS (dense)",
    frozenset({"bfloat16", "float16"}),
    simulated=True,
)


def launch_floor(device: torch.device) -> float:
    """The median seconds of one trivial kernel (a one-element add) launched and synchronised."""
    x = torch.zeros(1, device=device)

    def launch() -> None:
        x.add_(1)

    with timing_threads(device):
        launch()
        return statistics.median(call_s(launch, device) for _ in range(FLOOR_CALLS))


_FLOORS: dict[str, float] = {}


def device_speed(
    device: torch.device,
    *,
    launch_floor_s: float | None = None,
    published: Mapping[str, float | None] | None = None,
    published_origin: str = "",
) -> DeviceSpeed:
    """This device as sizing sees it: its launch floor (``launch_floor_s``, the one its class's
    calibration stored, else measured once a process), its peaks (a GPU's ``published`` datasheet
    figures; a CPU's from its cores on the timing's CPU_THREADS, :mod:`harness.platform.peaks`),
    and the dtypes its matrix units run."""
    floor = launch_floor_s
    if floor is None:
        floor = _FLOORS.get(str(device))
        if floor is None:
            floor = _FLOORS[str(device)] = launch_floor(device)
    if device.type == "cuda":
        peaks = {k: v for k, v in (published or {}).items() if v}
        origin = published_origin or "no published peak for this GPU: rates without a fraction"
        return DeviceSpeed(torch.cuda.get_device_name(device), "cuda", floor, peaks, origin, matrix_units(device))
    cpu = detect_cpu()
    freq, how = cpu_frequency_hz()
    p = cpu_peaks(cpu, CPU_THREADS, freq, how)
    return DeviceSpeed(cpu.model, "cpu", floor, dict(p.flops), p.origin, frozenset())


def matrix_units(device: torch.device) -> frozenset[str]:
    """The AMP dtypes a GPU's tensor cores run: fp16 from sm70, bf16 from sm80 (CUDA's compute
    capabilities); none on the CPU, where the physics floor is not claimed."""
    if device.type != "cuda":
        return frozenset()
    major, _ = torch.cuda.get_device_capability(device)
    return frozenset({"float16", *(("bfloat16",) if major >= 8 else ())}) if major >= 7 else frozenset()


@dataclass(frozen=True)
class Sizing:
    """The rung a case is measured at, and why."""

    workload: Workload
    size: int | None
    #: the chosen rung's fp32 seconds a call (None: one rung, not timed)
    fp32_call_s: float | None
    floor_s: float
    compute_bound: bool
    #: rung -> fp32 seconds a call, for each rung timed on the way
    climbed: tuple[tuple[int, float], ...] = ()

    def describe(self) -> str:
        if self.size is None:
            return f"{self.workload.name}: one size"
        call = f"{self.fp32_call_s * 1e3:.3g} ms" if self.fp32_call_s is not None else "not timed"
        bound = "compute-bound" if self.compute_bound else "NOT compute-bound (the ladder's top)"
        return (
            f"{self.workload.name} at {self.workload.size_name}={self.size}: fp32 call {call}, {bound} "
            f"(>= {COMPUTE_BOUND:g} x the {self.floor_s * 1e6:.3g} us launch floor)"
        )

    def tags(self) -> dict[str, object]:
        return {
            "size": self.size,
            "size_name": self.workload.size_name or None,
            "fp32_call_s": self.fp32_call_s,
            "launch_floor_s": self.floor_s,
            "compute_bound": self.compute_bound,
        }


def fp32_call_s(workload: Workload, device: torch.device) -> float:
    """One warm fp32 call's seconds (the median of three), by the cap clock, synchronised."""
    fn = workload.make(device, None)
    with timing_threads(device):
        fn()
        return statistics.median(call_s(fn, device) for _ in range(3))


def choose(
    workload: Workload,
    floor_s: float,
    time_of: Callable[[Workload], float],
    pinned: int | None = None,
) -> Sizing:
    """The smallest rung of ``workload``'s ladder whose fp32 call (``time_of``) is COMPUTE_BOUND
    launch floors or more; the ladder's top, said so, where none is. ``pinned``: the rung the
    class's calibration measured (thresholds hold for that size only), used as it is."""
    if not workload.sizes:
        return Sizing(workload, None, None, floor_s, True)
    if pinned is not None:
        if pinned not in workload.sizes:
            raise Capped(f"{workload.name}: the calibrated size {pinned} is not on its ladder {workload.sizes}")
        at = workload.at(pinned)
        t = time_of(at)
        return Sizing(at, pinned, t, floor_s, t >= COMPUTE_BOUND * floor_s, ((pinned, t),))
    climbed: list[tuple[int, float]] = []
    for size in workload.sizes:
        at = workload.at(size)
        t = time_of(at)
        climbed.append((size, t))
        if t >= COMPUTE_BOUND * floor_s:
            return Sizing(at, size, t, floor_s, True, tuple(climbed))
        if t >= MAX_RUNG_CALL_S:
            break
    size, t = climbed[-1]
    return Sizing(workload.at(size), size, t, floor_s, False, tuple(climbed))


@dataclass(frozen=True)
class Floor:
    """The physics floor of a case: AMP at least ``minimum`` times its baseline's speed."""

    minimum: float
    reason: str


def physics_floor(device: DeviceSpeed, sizing: Sizing, dtype: str) -> Floor | None:
    """Where matrix units run ``dtype`` and the case is compute-bound arithmetic (it has a FLOP
    count), AMP slower than fp32 is a regression calibrated or not: the floor is 1x. None elsewhere
    (the CPU kinds, where AMP is often slower by design; a launch-bound or memory-bound case)."""
    if dtype not in device.matrix_units or sizing.workload.flops is None or not sizing.compute_bound:
        return None
    fp32, amp = device.peaks.get("float32"), device.peaks.get(dtype)
    ratio = f" (peaks {amp / fp32:.3g}x fp32's: {device.peak_origin})" if fp32 and amp else ""
    return Floor(
        1.0,
        f"{device.name} runs {dtype} on matrix units{ratio}: a compute-bound {sizing.workload.name} slower in AMP than "
        "in fp32 is a regression whatever this class's calibration says",
    )


#: The launch-bound case's side: a 64 x 64 matmul is half a MFLOP, nanoseconds of arithmetic on any
#: GPU: its eager time is a launch.
LAUNCH_BOUND_N = 64
#: Calls in the launch-bound case's CUDA graph (and its eager block).
LAUNCH_BOUND_CALLS = 100


@dataclass(frozen=True)
class LaunchOverhead:
    """A launch-bound matmul timed eager (launch plus arithmetic) and replayed from a CUDA graph
    (arithmetic, one launch for all calls): the difference is the launch overhead, reported apart."""

    eager_s: float
    graph_s: float

    @property
    def overhead_s(self) -> float:
        return self.eager_s - self.graph_s


def launch_overhead(device: torch.device, dtype: torch.dtype, calls: int = LAUNCH_BOUND_CALLS) -> LaunchOverhead:
    """Seconds a call of a LAUNCH_BOUND_N matmul in ``dtype`` takes eager and from a CUDA graph (CUDA
    events around each, synchronised). CUDA only: the CPU has no launches to take apart."""
    if device.type != "cuda":
        raise ValueError("the launch-bound case needs CUDA: CUDA graphs replay GPU launches")
    g = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(LAUNCH_BOUND_N, LAUNCH_BOUND_N, device=device, generator=g).to(dtype) for _ in range(2))
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the capture stream, as CUDA graph capture asks
        for _ in range(3):
            a @ b
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            a @ b

    def timed(run: Callable[[], None]) -> float:
        run()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        run()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end)) / 1e3 / calls

    def eager() -> None:
        for _ in range(calls):
            a @ b

    return LaunchOverhead(timed(eager), timed(graph.replay))
