"""Hardware detection and hardware-profile ids.

A profile id names a class of machine whose measurements are comparable (``cpu-avx512bf16``,
``nvidia-h200``): speed thresholds and golden curves are keyed by it. Detection reads
``/proc/cpuinfo`` and ``torch.cuda``; torch is imported only when detection runs.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

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

#: Known profile ids and what they mean. Unknown GPUs are detected as ``nvidia-smXY``.
KNOWN_PROFILES: dict[str, str] = {
    "cpu-generic": "CPU without AVX2 (or not x86): no fast low-precision path expected",
    "cpu-avx2": "x86 CPU with AVX2/FMA/F16C: fp16 and bf16 converted to fp32 for compute",
    "cpu-avx512": "x86 CPU with AVX-512F but no native bf16 dot product",
    "cpu-avx512bf16": "x86 CPU with AVX512_BF16 (vdpbf16ps): bf16 matmul faster than fp32",
    "cpu-amxbf16": "x86 CPU with AMX-BF16 tiles (Sapphire Rapids and later)",
    "nvidia-v100": "NVIDIA V100 (sm70): fp16 tensor cores, no bf16",
    "nvidia-a100": "NVIDIA A100 (sm80): fp16/bf16 tensor cores",
    "nvidia-l4": "NVIDIA L4 (sm89): fp16/bf16/fp8 tensor cores",
    "nvidia-h100": "NVIDIA H100 (sm90): fp16/bf16/fp8 tensor cores",
    "nvidia-h200": "NVIDIA H200 (sm90): H100 compute with 141 GB HBM3e",
    "generic": "any machine: measurements are recorded, never judged against thresholds",
}
_GENERIC_GPU = re.compile(r"^nvidia-sm\d{2,3}$")
_WELL_FORMED = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_GPU_NAMES = (
    ("H200", "nvidia-h200"),
    ("H100", "nvidia-h100"),
    ("A100", "nvidia-a100"),
    ("V100", "nvidia-v100"),
    ("L4", "nvidia-l4"),
)


class ProfileError(ValueError):
    """An unknown or malformed hardware profile id."""


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    logical_cores: int
    flags: tuple[str, ...]


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

    @property
    def cpu_profile(self) -> str:
        return cpu_profile_id(self.cpu)

    @property
    def cuda_profile(self) -> str | None:
        return gpu_profile_id(self.gpus[0]) if self.gpus else None

    @property
    def torch_minor(self) -> str:
        """``torch-2.13``: the software-stack key of baselines that change between releases."""
        m = re.match(r"(\d+)\.(\d+)", self.torch_version)
        return f"torch-{m.group(1)}.{m.group(2)}" if m else f"torch-{self.torch_version}"

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cpu_profile"] = self.cpu_profile
        d["cuda_profile"] = self.cuda_profile
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
    for token, pid in _GPU_NAMES:
        if re.search(rf"\b{token}\b", upper):
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


def _read_cpuinfo() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name":
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    return model, tuple(f for f in RELEVANT_CPU_FLAGS if f in flags)


def detect_cpu() -> CpuInfo:
    model, flags = _read_cpuinfo()
    return CpuInfo(model=model, arch=platform.machine(), logical_cores=os.cpu_count() or 1, flags=flags)


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
    return Fingerprint(
        cpu=detect_cpu(),
        gpus=tuple(gpus),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=cudnn,
        driver_version=_nvidia_driver() if gpus else None,
        python_version=sys.version.split()[0],
        platform=platform.platform(),
        hostname=socket.gethostname(),
    )
