"""Hardware detection: profile ids (ISA level) and hardware classes (precise enough for speed).

Two names for a machine, for two purposes:

* a **profile id** (``cpu-avx512bf16``, ``nvidia-h200``) says which low-precision kernels the
  machine has. It keys baselines that follow the kernels' numerics (golden loss curves).
* a **hardware class** (``cpu-amd-zen4-f25m17-avx512bf16-t2``, ``cuda-nvidia-h200-sm90-140g``)
  names machines whose *speed* is comparable: vendor, family/model (microarchitecture where
  known), the ISA features that change the low-precision kernels and the number of threads torch
  uses with the machine to itself (:func:`machine_threads`); for GPUs the name, compute
  capability and memory. Speed thresholds belong to a class: two CPUs with the same flags can
  differ several times in bf16-vs-fp32 speed (docs/hardware-and-speed.md has the figures per kind).

Detection reads ``/proc/cpuinfo`` and ``torch.cuda``; torch is imported only when detection runs.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from harness.platform.versions import minor

#: CPU flags that decide low-precision speed on x86 (bf16/fp16 dot products, AMX tiles).
RELEVANT_CPU_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_fp16",
)


@dataclass(frozen=True)
class ProfileInfo:
    """One ISA-level profile id: what it means, how a GPU name maps to it, its published peaks."""

    description: str
    #: a word of the GPU's name that identifies it (``H200``); None for CPU profiles
    gpu_token: str | None = None
    #: dense peak rates from the vendor's datasheet (FLOP/s), for the fraction-of-peak rows
    peak_flops: dict[str, float] = field(default_factory=dict)
    peak_origin: str = ""


#: Every known profile id, in one place. Unknown GPUs are detected as ``nvidia-smXY``. GPU rows are
#: in matching order (H200 before H100: a name is matched on its first listed token).
PROFILES: dict[str, ProfileInfo] = {
    "cpu-generic": ProfileInfo("CPU without AVX2 (or not x86): no fast low-precision path expected"),
    "cpu-avx2": ProfileInfo("x86 CPU with AVX2/FMA/F16C: fp16 and bf16 converted to fp32 for compute"),
    "cpu-avx512": ProfileInfo("x86 CPU with AVX-512F but no native bf16 dot product"),
    "cpu-avx512bf16": ProfileInfo("x86 CPU with AVX512_BF16 (vdpbf16ps); bf16 speed differs by vendor and model"),
    "cpu-amxbf16": ProfileInfo("x86 CPU with AMX-BF16 tiles (Sapphire Rapids and later)"),
    "nvidia-h200": ProfileInfo(
        "NVIDIA H200 (sm90): H100 compute with 141 GB HBM3e",
        "H200",
        {"float32": 67e12, "bfloat16": 989.4e12, "float16": 989.4e12},
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67 TFLOPS, BF16/FP16 Tensor Core 989 TFLOPS (dense)",
    ),
    "nvidia-h100": ProfileInfo(
        "NVIDIA H100 (sm90): fp16/bf16/fp8 tensor cores",
        "H100",
        {"float32": 67e12, "bfloat16": 989.4e12, "float16": 989.4e12},
        "NVIDIA H100 Tensor Core GPU datasheet (SXM): FP32 67 TFLOPS, BF16/FP16 Tensor Core 989.4 TFLOPS (dense)",
    ),
    "nvidia-a100": ProfileInfo(
        "NVIDIA A100 (sm80): fp16/bf16 tensor cores",
        "A100",
        {"float32": 19.5e12, "bfloat16": 312e12, "float16": 312e12},
        "NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5 TFLOPS, BF16/FP16 Tensor Core 312 TFLOPS (dense)",
    ),
    "nvidia-v100": ProfileInfo("NVIDIA V100 (sm70): fp16 tensor cores, no bf16", "V100"),
    "nvidia-l4": ProfileInfo("NVIDIA L4 (sm89): fp16/bf16/fp8 tensor cores", "L4"),
    "generic": ProfileInfo("any machine: measurements are recorded, never judged against thresholds"),
}
KNOWN_PROFILES: dict[str, str] = {pid: info.description for pid, info in PROFILES.items()}
_GENERIC_GPU = re.compile(r"^nvidia-sm\d{2,3}$")
_WELL_FORMED = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


class ProfileError(ValueError):
    """An unknown or malformed hardware profile id."""


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    logical_cores: int
    #: the relevant flags the low-precision kernels may use: the CPU's, less what a oneDNN ISA cap
    #: (``ONEDNN_MAX_CPU_ISA``) forbids
    flags: tuple[str, ...]
    vendor: str = ""
    family: int | None = None
    model_number: int | None = None
    #: the oneDNN ISA cap in force (``AVX512_CORE_FP16``), None where none is
    isa_cap: str | None = None
    #: the ATen CPU capability in force (``avx2``) where ``ATEN_CPU_CAPABILITY`` set one, else None
    aten_capability: str | None = None


#: oneDNN's ISA levels, lowest first, as ``ONEDNN_MAX_CPU_ISA`` names them (the oneDNN developer
#: guide's "CPU dispatcher control"; aliases on one line share a level). torch's bf16 and fp16
#: matmuls, convolutions and attention run through oneDNN, so a cap changes their speed (with
#: AMX exposed, capping below AMX makes bf16 matmul slower than fp32) but leaves the CPU's flags.
ONEDNN_ISA_LEVELS: tuple[tuple[str, ...], ...] = (
    ("SSE41",),
    ("AVX",),
    ("AVX2",),
    ("AVX2_VNNI",),
    ("AVX2_VNNI_2",),
    ("AVX512_CORE",),
    ("AVX512_CORE_VNNI",),
    ("AVX512_CORE_BF16",),
    ("AVX10_1_512", "AVX512_CORE_FP16"),
    ("AVX10_1_512_AMX", "AVX512_CORE_AMX"),
    ("AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16"),
)
#: the lowest oneDNN level that uses each flag
_ONEDNN_FLAG_LEVEL = {
    "avx2": "AVX2",
    "fma": "AVX2",
    "f16c": "AVX2",
    "avx512f": "AVX512_CORE",
    "avx512_vnni": "AVX512_CORE_VNNI",
    "avx512_bf16": "AVX512_CORE_BF16",
    "avx512_fp16": "AVX512_CORE_FP16",
    "amx_tile": "AVX512_CORE_AMX",
    "amx_bf16": "AVX512_CORE_AMX",
    "amx_fp16": "AVX512_CORE_AMX_FP16",
}

#: ATen's x86 CPU capabilities, lowest first, as ``ATEN_CPU_CAPABILITY`` names them. torch's
#: DispatchStub compares the variable's value with these exact lowercase words and ignores any
#: other value (with a warning); its vectorised elementwise, reduction and conversion kernels
#: (bf16 and fp16 casts among them) are the capability's.
ATEN_CAPABILITIES = ("default", "avx2", "avx512")
#: the lowest ATen capability that uses each general flag; oneDNN-only flags are not ATen's
_ATEN_FLAG_LEVEL = {"avx2": "avx2", "fma": "avx2", "f16c": "avx2", "avx512f": "avx512"}


def _onednn_level(name: str) -> int | None:
    for rank, names in enumerate(ONEDNN_ISA_LEVELS):
        if name in names:
            return rank
    return None


def onednn_isa_cap(environ: Mapping[str, str] | None = None) -> str | None:
    """The oneDNN ISA cap set in the environment, as oneDNN reads it, or None.

    ``ONEDNN_MAX_CPU_ISA`` wins over its older name ``DNNL_MAX_CPU_ISA``; ``ALL``, ``DEFAULT`` and
    names oneDNN does not know leave the ISA uncapped, as they do in oneDNN.
    """
    env = os.environ if environ is None else environ
    raw = env.get("ONEDNN_MAX_CPU_ISA") or env.get("DNNL_MAX_CPU_ISA")
    if not raw:
        return None
    name = raw.strip().upper()
    return name if _onednn_level(name) is not None else None


def aten_capability(environ: Mapping[str, str] | None = None) -> str | None:
    """The ATen CPU capability ``ATEN_CPU_CAPABILITY`` asks for, as torch reads it (one of
    :data:`ATEN_CAPABILITIES`, exact lowercase), or None where it is unset or a value torch ignores."""
    env = os.environ if environ is None else environ
    raw = env.get("ATEN_CPU_CAPABILITY")
    return raw if raw in ATEN_CAPABILITIES else None


def native_aten_capability(flags: tuple[str, ...]) -> str:
    """The ATen capability torch picks for a CPU with ``flags`` when nothing caps it."""
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= set(flags) else "default"


def capped(cpu: CpuInfo, cap: str | None, aten: str | None = None) -> CpuInfo:
    """``cpu`` as its kernels see it under a oneDNN ISA cap (:func:`onednn_isa_cap`) and an ATen
    capability (:func:`aten_capability`): less the flags neither may use, with both recorded.

    oneDNN runs the bf16 and fp16 matmuls, convolutions and attention; ATen's own vectorised
    kernels run the elementwise work and the casts around them. A flag both use (avx2, avx512f)
    stays while either may use it; a oneDNN-only flag (avx512_bf16, AMX) follows oneDNN's cap alone.
    The oneDNN cap is recorded as set; an ATen capability only where it is below the CPU's own.
    """
    level = None if cap is None else _onednn_level(cap)
    aten_level = ATEN_CAPABILITIES.index(aten) if aten in ATEN_CAPABILITIES else None
    native_aten = ATEN_CAPABILITIES.index(native_aten_capability(cpu.flags))
    if aten_level is not None and aten_level >= native_aten:
        aten_level = None

    def usable(flag: str) -> bool:
        by_onednn = level is None or (_onednn_level(_ONEDNN_FLAG_LEVEL.get(flag, "SSE41")) or 0) <= level
        if flag not in _ATEN_FLAG_LEVEL:
            return by_onednn
        by_aten = aten_level is None or ATEN_CAPABILITIES.index(_ATEN_FLAG_LEVEL[flag]) <= aten_level
        return by_onednn or by_aten

    flags = tuple(f for f in cpu.flags if usable(f))
    return replace(
        cpu,
        flags=flags,
        isa_cap=cap if level is not None else cpu.isa_cap,
        aten_capability=ATEN_CAPABILITIES[aten_level] if aten_level is not None else None,
    )


#: The flags whose kernels compute a low-precision dtype natively; where the kernels in force have
#: none of them, oneDNN and ATen emulate it through fp32 (AVX2-only kernel sets: bf16 autocast tens
#: of times slower than fp32, docs/hardware-and-speed.md).
NATIVE_DTYPE_FLAGS: dict[str, tuple[str, ...]] = {
    "bf16": ("avx512_bf16", "amx_bf16"),
    "fp16": ("avx512_fp16", "amx_fp16"),
}


def emulated(dtype: str, cpu: CpuInfo) -> str | None:
    """Why ``dtype`` (``bf16`` or ``fp16``) is emulated by the kernels of ``cpu`` (as capped: see
    :func:`capped`), in words; None where it runs natively."""
    native = NATIVE_DTYPE_FLAGS.get(dtype)
    if native is None:
        raise ValueError(f"unknown low-precision dtype {dtype!r}; choose from {', '.join(NATIVE_DTYPE_FLAGS)}")
    if any(f in cpu.flags for f in native):
        return None
    return f"{dtype} is emulated on {kernel_set(cpu)}: none of {', '.join(native)}"


def kernel_set(cpu: CpuInfo) -> str:
    """The CPU kernel set in words: the ISA tag, and the caps that made it where any did
    (``avx2 (oneDNN capped to AVX2, ATen avx2)``): what a skip names when a kernel is missing."""
    caps = [
        *([f"oneDNN capped to {cpu.isa_cap}"] if cpu.isa_cap else []),
        *([f"ATen {cpu.aten_capability}"] if cpu.aten_capability else []),
    ]
    return isa_tag(cpu) + (f" ({', '.join(caps)})" if caps else "")


#: (vendor, family, first model, last model) -> microarchitecture, for the CPUs these machines and
#: common CI fleets come as; an unlisted one is named by its family/model numbers alone.
MICROARCHITECTURES: tuple[tuple[str, int, int, int, str], ...] = (
    ("AuthenticAMD", 23, 0x00, 0x2F, "zen1"),
    ("AuthenticAMD", 23, 0x30, 0xFF, "zen2"),
    ("AuthenticAMD", 25, 0x00, 0x0F, "zen3"),
    ("AuthenticAMD", 25, 0x10, 0x1F, "zen4"),
    ("AuthenticAMD", 25, 0x20, 0x5F, "zen3"),
    ("AuthenticAMD", 25, 0x60, 0xAF, "zen4"),
    ("AuthenticAMD", 26, 0x00, 0xFF, "zen5"),
    ("GenuineIntel", 6, 85, 85, "skylakex"),
    ("GenuineIntel", 6, 106, 106, "icelakex"),
    ("GenuineIntel", 6, 143, 143, "sapphirerapids"),
    ("GenuineIntel", 6, 207, 207, "emeraldrapids"),
    ("GenuineIntel", 6, 173, 173, "graniterapids"),
)
_VENDORS = {"AuthenticAMD": "amd", "GenuineIntel": "intel"}


def microarchitecture(cpu: CpuInfo) -> str | None:
    """The microarchitecture's name where this harness knows it, else None."""
    for vendor, family, lo, hi, name in MICROARCHITECTURES:
        if (
            cpu.vendor == vendor
            and cpu.family == family
            and cpu.model_number is not None
            and lo <= cpu.model_number <= hi
        ):
            return name
    return None


@dataclass(frozen=True)
class HardwareClass:
    """Machines whose speed is comparable; speed thresholds are calibrated per class."""

    id: str
    #: the inputs the id was derived from, shown by ``amp-harness profile`` and stored in run.json
    derived_from: dict[str, Any]

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.derived_from.items())


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def isa_tag(cpu: CpuInfo) -> str:
    """The ISA features that change the low-precision kernels, compactly (``avx512bf16-fp16``)."""
    base = cpu_profile_id(cpu).removeprefix("cpu-")
    flags = set(cpu.flags)
    extra = [tag for flag, tag in (("avx512_fp16", "fp16"), ("amx_fp16", "amxfp16")) if flag in flags]
    return "-".join([base, *extra])


def cpu_class(cpu: CpuInfo, threads: int) -> HardwareClass:
    vendor = _VENDORS.get(cpu.vendor, _slug(cpu.vendor or cpu.arch))
    uarch = microarchitecture(cpu)
    fm = f"f{cpu.family}m{cpu.model_number}" if cpu.family is not None and cpu.model_number is not None else None
    # an ATen capability below what the remaining flags imply runs other elementwise kernels than
    # any uncapped CPU with those flags: the class says so
    aten = (
        f"aten{cpu.aten_capability}"
        if cpu.aten_capability and cpu.aten_capability != native_aten_capability(cpu.flags)
        else None
    )
    parts = ["cpu", vendor, *(p for p in (uarch, fm) if p), isa_tag(cpu), *([aten] if aten else []), f"t{threads}"]
    return HardwareClass(
        "-".join(parts),
        {
            "vendor": cpu.vendor or "unknown",
            "family": cpu.family,
            "model": cpu.model_number,
            "microarchitecture": uarch or "not in the harness's table",
            "isa": isa_tag(cpu),
            "torch_threads": threads,
            "model_name": cpu.model,
            **({"onednn_max_cpu_isa": cpu.isa_cap} if cpu.isa_cap else {}),
            **({"aten_cpu_capability": cpu.aten_capability} if cpu.aten_capability else {}),
        },
    )


def gpu_class(gpu: GpuInfo) -> HardwareClass:
    gib = round(gpu.memory_bytes / 2**30)
    cc = gpu.capability.replace(".", "")
    return HardwareClass(
        f"cuda-{_slug(gpu.name)}-sm{cc}-{gib}g",
        {
            "name": gpu.name,
            "compute_capability": gpu.capability,
            "memory_gib": gib,
            "multiprocessors": gpu.multiprocessors,
        },
    )


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    capability: str
    memory_bytes: int
    multiprocessors: int


@dataclass(frozen=True)
class Fingerprint:
    """What detection saw: the environment a run's numbers belong to."""

    cpu: CpuInfo
    gpus: tuple[GpuInfo, ...]
    torch_version: str
    cuda_version: str | None
    cudnn_version: int | None
    driver_version: str | None
    python_version: str
    platform: str
    hostname: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: intra-op threads torch uses with the machine to itself (:func:`machine_threads`): part of a
    #: CPU's hardware class
    torch_threads: int = 1

    @property
    def cpu_profile(self) -> str:
        return cpu_profile_id(self.cpu)

    @property
    def cuda_profile(self) -> str | None:
        return gpu_profile_id(self.gpus[0]) if self.gpus else None

    @property
    def torch_minor(self) -> str:
        """``torch-2.13``: the software-stack key of baselines that change between releases."""
        try:
            return f"torch-{minor(self.torch_version)}"
        except ValueError:
            return f"torch-{self.torch_version}"

    @property
    def cpu_class(self) -> HardwareClass:
        return cpu_class(self.cpu, self.torch_threads)

    @property
    def cuda_class(self) -> HardwareClass | None:
        return gpu_class(self.gpus[0]) if self.gpus else None

    def class_for(self, device: str) -> HardwareClass:
        """The hardware class of ``cpu`` or ``cuda:N``."""
        if device.startswith("cuda") and self.gpus:
            index = int(device.partition(":")[2] or 0)
            return gpu_class(self.gpus[min(index, len(self.gpus) - 1)])
        return self.cpu_class

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu_profile"] = self.cpu_profile
        d["cuda_profile"] = self.cuda_profile
        d["cpu_class"] = {"id": self.cpu_class.id, "derived_from": self.cpu_class.derived_from}
        cc = self.cuda_class
        d["cuda_class"] = None if cc is None else {"id": cc.id, "derived_from": cc.derived_from}
        return d


def cpu_profile_id(cpu: CpuInfo) -> str:
    flags = set(cpu.flags)
    if "amx_bf16" in flags:
        return "cpu-amxbf16"
    if "avx512_bf16" in flags:
        return "cpu-avx512bf16"
    if "avx512f" in flags:
        return "cpu-avx512"
    if "avx2" in flags:
        return "cpu-avx2"
    return "cpu-generic"


def gpu_profile_id(gpu: GpuInfo) -> str:
    upper = gpu.name.upper()
    for pid, info in PROFILES.items():
        if info.gpu_token is not None and re.search(rf"\b{info.gpu_token}\b", upper):
            return pid
    return "nvidia-sm" + gpu.capability.replace(".", "")


def validate_profile(profile_id: str, extra_known: tuple[str, ...] = ()) -> str:
    """Return ``profile_id`` if it is known (or a generic ``nvidia-smXY``), else raise ProfileError."""
    known = sorted({*KNOWN_PROFILES, *extra_known})
    if not _WELL_FORMED.match(profile_id):
        raise ProfileError(
            f"malformed hardware profile {profile_id!r}: ids are lowercase words joined by '-' "
            f"(e.g. cpu-avx512bf16). Known profiles: {', '.join(known)}"
        )
    if profile_id in known or _GENERIC_GPU.match(profile_id):
        return profile_id
    raise ProfileError(
        f"unknown hardware profile {profile_id!r}. Known profiles: {', '.join(known)} "
        "(or nvidia-smXY for an unlisted NVIDIA GPU). Omit --amp-profile to detect it."
    )


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The first processor's model name, vendor, family, model number and flags."""
    out: dict[str, Any] = {"flags": set()}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and "model" not in out:
            out["model"] = value
        elif key == "vendor_id" and "vendor" not in out:
            out["vendor"] = value
        elif key == "cpu family" and "family" not in out and value.isdigit():
            out["family"] = int(value)
        elif key == "model" and "model_number" not in out and value.isdigit():
            out["model_number"] = int(value)
        elif key in ("flags", "Features"):
            out["flags"].update(value.split())
    return out


def detect_cpu(aten: str | None = None) -> CpuInfo:
    """This CPU as its kernels see it; ``aten``: the ATen capability in force, where known (else
    ``ATEN_CPU_CAPABILITY`` read as torch reads it)."""
    return detect_cpu_from(os.environ, aten)


def detect_cpu_from(environ: Mapping[str, str], aten: str | None = None) -> CpuInfo:
    """:func:`detect_cpu` with the caps that ``environ`` sets."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            info = parse_cpuinfo(fh.read())
    except OSError:
        info = {"flags": set()}
    cpu = CpuInfo(
        model=info.get("model") or platform.processor() or platform.machine(),
        arch=platform.machine(),
        logical_cores=os.cpu_count() or 1,
        flags=tuple(f for f in RELEVANT_CPU_FLAGS if f in info["flags"]),
        vendor=info.get("vendor", ""),
        family=info.get("family"),
        model_number=info.get("model_number"),
    )
    return capped(cpu, onednn_isa_cap(environ), aten or aten_capability(environ))


def _nvidia_driver() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def detect() -> Fingerprint:
    """Detect the machine. Imports torch."""
    import torch

    gpus: list[GpuInfo] = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append(GpuInfo(i, p.name, f"{p.major}.{p.minor}", int(p.total_memory), int(p.multi_processor_count)))
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None  # type: ignore[no-untyped-call]
    # where the variable asked for an ATen capability, torch's own answer is the one in force
    aten = torch.backends.cpu.get_cpu_capability().lower() if aten_capability() is not None else None
    return Fingerprint(
        cpu=detect_cpu(aten),
        gpus=tuple(gpus),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=cudnn,
        driver_version=_nvidia_driver() if gpus else None,
        python_version=sys.version.split()[0],
        platform=platform.platform(),
        hostname=socket.gethostname(),
        torch_threads=machine_threads(),
    )


#: torch's thread count before a share of the cores was taken in this process (an xdist worker's,
#: :func:`share_threads`); None while the process has not given any away
_MACHINE_THREADS: int | None = None


def share_threads(n: int) -> None:
    """Give torch ``n`` intra-op threads for this process's share of the machine (an xdist worker's
    share of the cores), remembering what it had: the hardware class keeps naming the machine."""
    import torch

    global _MACHINE_THREADS
    if _MACHINE_THREADS is None:
        _MACHINE_THREADS = torch.get_num_threads()
    torch.set_num_threads(n)


def computing_class(class_id: str) -> str:
    """A hardware class as a key of bitwise-reproducible numerics: on the CPU, with the intra-op
    threads torch computes on now, not the machine's (:func:`machine_threads`): a reduction split
    over another number of threads rounds differently, so an xdist worker's one-thread results are
    never held bitwise to a serial run's. A GPU class is unchanged."""
    import torch

    if not class_id.startswith("cpu-"):
        return class_id
    return re.sub(r"-t\d+$", f"-t{torch.get_num_threads()}", class_id)


def machine_threads() -> int:
    """The intra-op threads torch has when a process has the machine to itself: a serial run's,
    ``amp-harness calibrate``'s. An xdist worker gives its torch a share of the cores, but its
    timing tests hold the machine alone and time on the same threads as calibration
    (``bench.CPU_THREADS``), so its hardware class is the machine's, and so are its thresholds."""
    import torch

    return _MACHINE_THREADS if _MACHINE_THREADS is not None else torch.get_num_threads()


@dataclass(frozen=True)
class KernelSet:
    """Another CPU kind's kernels, run on this CPU by capping oneDNN and ATen (what CI proves the
    suites on, and a developer reproduces a kind with): which kind, and the environment it takes."""

    name: str
    kind: str
    environ: dict[str, str]
    #: the CPU flags the set's kernels use at most: a CPU that lacks one runs its own, lower kernels
    flags: tuple[str, ...]

    @property
    def assignments(self) -> str:
        """The environment in shell words: ``ONEDNN_MAX_CPU_ISA=AVX2 ...``."""
        return " ".join(f"{k}={v}" for k, v in self.environ.items())

    def on(self, cpu: CpuInfo) -> CpuInfo:
        """``cpu`` (uncapped) as it runs under this set."""
        return capped(cpu, onednn_isa_cap(self.environ), aten_capability(self.environ))

    def shortfall(self, cpu: CpuInfo) -> tuple[str, ...]:
        """The set's flags this CPU lacks (a cap cannot add what the CPU has not)."""
        return tuple(f for f in self.flags if f not in cpu.flags)


#: The kinds these machines come as, by their kernels. Emulation caps the ISA: it keeps the
#: kernels and their numerics, not the microarchitecture's timing or cache sizes (docs/running.md).
KERNEL_SETS: dict[str, KernelSet] = {
    ks.name: ks
    for ks in (
        KernelSet(
            "zen4",
            "AMD Zen 4: avx512_bf16, no avx512_fp16, no AMX",
            {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
            ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16"),
        ),
        KernelSet(
            "avx2",
            "AVX2 only (AMD Zen 2 and Zen 3; many laptops and CI runners): bf16 and fp16 emulated",
            {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
            ("avx2", "fma", "f16c"),
        ),
        KernelSet(
            "intel-noamx",
            "Intel Xeon without AMX: avx512_bf16 and avx512_fp16",
            {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_FP16"},
            ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16"),
        ),
    )
}


def uncapped_cpu() -> CpuInfo:
    """This CPU's own flags, whatever caps the environment sets."""
    return detect_cpu_from({})
