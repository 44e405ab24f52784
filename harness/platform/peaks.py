"""A device's dense peak arithmetic rate per dtype, for the fraction-of-peak rows of the speed checks.

GPUs: the vendor's datasheet, per profile id (:data:`harness.platform.hardware.PROFILES`, TF32 off:
the fp32 figure is the non-tensor-core one, as the harness keeps fp32 matmuls at full precision).
CPUs: cores x frequency x the FLOPs one core's FMA units retire a cycle, where the harness knows
the microarchitecture's units (:data:`FLOP_PER_CYCLE`); an unknown one has no peak, and its rates
are recorded without a fraction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.platform.hardware import CpuInfo, emulated, microarchitecture

#: fp32 FLOPs one core retires a cycle: 2 (an FMA is a multiply and an add) x SIMD lanes x FMA
#: pipes. Sources: AMD's Zen 2/3 and Zen 4 software optimization guides (two 256-bit FMA pipes; Zen
#: 4 runs AVX-512 as two 256-bit halves), AMD's Zen 5 (EPYC 9005) guide (two 512-bit FMA pipes),
#: Intel's optimization reference manual for Xeon Scalable with two 512-bit FMA units per core.
FLOP_PER_CYCLE: Mapping[str, float] = {
    "zen2": 2 * 8 * 2,
    "zen3": 2 * 8 * 2,
    "zen4": 2 * 8 * 2,
    "zen5": 2 * 16 * 2,
    "skylakex": 2 * 16 * 2,
    "icelakex": 2 * 16 * 2,
    "sapphirerapids": 2 * 16 * 2,
    "emeraldrapids": 2 * 16 * 2,
    "graniterapids": 2 * 16 * 2,
}
#: bf16 FLOPs a core retires a cycle on its matrix units: Intel's AMX-BF16, 1024 a cycle per core
#: (Intel Architecture Instruction Set Extensions reference: a TDPBF16PS of 16x32 by 32x16 tiles in
#: 16 cycles); AMX-FP16 the same for fp16 (Granite Rapids).
AMX_FLOP_PER_CYCLE = 1024.0
#: AVX512_BF16's VDPBF16PS multiplies and adds two bf16 pairs into each fp32 lane: twice the fp32 rate.
AVX512_BF16_FACTOR = 2.0


@dataclass(frozen=True)
class Peaks:
    """Dense peak FLOP/s per dtype (a dtype missing: no peak known) and where they come from."""

    flops: Mapping[str, float]
    origin: str

    def fraction(self, rate: float, dtype: str) -> float | None:
        """``rate`` as a fraction of the dtype's peak; None where no peak is known."""
        peak = self.flops.get(dtype)
        return rate / peak if peak else None


def cpu_frequency_hz(cpuinfo: str | None = None, sysfs: Path | None = None) -> tuple[float | None, str]:
    """The cores' clock: the maximum cpufreq reports, else /proc/cpuinfo's ``cpu MHz`` (a VM's
    nominal clock); None where neither says."""
    max_freq = (sysfs or Path("/sys/devices/system/cpu/cpu0/cpufreq")) / "cpuinfo_max_freq"
    try:
        return float(max_freq.read_text().strip()) * 1e3, "cpufreq cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            return None, ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz":
            try:
                return float(value) * 1e6, "/proc/cpuinfo cpu MHz"
            except ValueError:
                break
    return None, ""


def cpu_peaks(cpu: CpuInfo, threads: int, frequency_hz: float | None, frequency_origin: str = "") -> Peaks:
    """The CPU's peaks on ``threads`` cores at ``frequency_hz``: fp32 from its FMA units; bf16 and
    fp16 from AMX or AVX512_BF16 where the kernels in force have them, else the fp32 peak (they are
    converted and computed in fp32); none where the microarchitecture or the clock is unknown."""
    arch = microarchitecture(cpu)
    per_cycle = FLOP_PER_CYCLE.get(arch or "")
    if per_cycle is None or not frequency_hz:
        why = f"microarchitecture {arch or 'unknown'}" if per_cycle is None else "no clock frequency"
        return Peaks({}, f"no peak: {why} (rates are recorded without a fraction)")
    base = threads * frequency_hz
    fp32 = base * per_cycle
    flops = {"float32": fp32}
    said = [
        f"fp32 {threads} cores x {frequency_hz / 1e9:.3g} GHz ({frequency_origin}) x {per_cycle:g} FLOP/cycle ({arch})"
    ]
    for dtype, short, amx in (("bfloat16", "bf16", "amx_bf16"), ("float16", "fp16", "amx_fp16")):
        if amx in cpu.flags:
            flops[dtype] = base * AMX_FLOP_PER_CYCLE
            said.append(f"{short} AMX {AMX_FLOP_PER_CYCLE:g} FLOP/cycle")
        elif dtype == "bfloat16" and "avx512_bf16" in cpu.flags:
            flops[dtype] = fp32 * AVX512_BF16_FACTOR
            said.append(f"bf16 AVX512_BF16 {AVX512_BF16_FACTOR:g}x fp32")
        elif emulated(short, cpu) is not None:
            flops[dtype] = fp32
            said.append(f"{short} converted to fp32: the fp32 peak")
    return Peaks(flops, "; ".join(said))
