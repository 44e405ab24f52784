"""Which low-precision kernels this stack has, asked of the stack itself.

A CPU's flags do not say whether a kernel exists: ``torch._scaled_mm`` on the CPU runs through
oneDNN's fp8 matmul where torch sees AMX and an fp32 emulation elsewhere, and oneDNN has an fp8
matmul only from avx512_core_fp16 up, so the same CPU under ``ONEDNN_MAX_CPU_ISA`` can lose it (a
RuntimeError, "could not create a primitive descriptor for the matmul primitive"). The probes run
the smallest call of the kind the suites make, once per device, and say what is missing on which
kernel set.
"""

from __future__ import annotations

import functools

import torch

from harness.platform.hardware import detect_cpu, kernel_set

#: the operand layouts and scalings the fp8 suite and torchao's Float8Linear call ``_scaled_mm``
#: with: (a's dtype, b's dtype, rowwise scales)
SCALED_MM_CALLS: tuple[tuple[str, str, bool], ...] = (
    ("float8_e4m3fn", "float8_e4m3fn", False),
    ("float8_e5m2", "float8_e4m3fn", False),
    ("float8_e4m3fn", "float8_e5m2", False),
    ("float8_e4m3fn", "float8_e4m3fn", True),
)
#: the probe's shape: a multiple of 16 in every dimension, as ``_scaled_mm`` requires on CUDA
PROBE_SHAPE = 16


def first_line(error: BaseException) -> str:
    """What a kernel (or any op) said when it raised: the first line of its message, or the
    exception's type where the message is empty."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def where(device: torch.device) -> str:
    """The kernel set a device runs, in words: the CPU's (with its caps), or the GPU's name."""
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (sm{''.join(map(str, torch.cuda.get_device_capability(device)))})"
    return f"the CPU kernel set {kernel_set(detect_cpu())}"


def _scaled_mm_call(device: torch.device, a_dtype: str, b_dtype: str, rowwise: bool, out: torch.dtype) -> None:
    n = PROBE_SHAPE
    a = torch.ones(n, n, device=device).to(getattr(torch, a_dtype))
    b = torch.ones(n, n, device=device).to(getattr(torch, b_dtype)).t()  # column-major, as required
    sa = torch.ones(n, 1, device=device) if rowwise else torch.ones((), device=device)
    sb = torch.ones(1, n, device=device) if rowwise else torch.ones((), device=device)
    torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=out)


@functools.cache
def _scaled_mm_missing(device: torch.device, implementation: object) -> str | None:
    if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return f"torch {torch.__version__} has no torch._scaled_mm or no float8 dtypes"
    failed: dict[str, list[str]] = {}  # error -> the calls that raised it
    for a_dtype, b_dtype, rowwise in SCALED_MM_CALLS:
        for out in (torch.bfloat16, torch.float32):
            try:
                _scaled_mm_call(device, a_dtype, b_dtype, rowwise, out)
            except (RuntimeError, NotImplementedError) as e:
                error = first_line(e)
                call = f"{a_dtype[6:]} x {b_dtype[6:]} {'rowwise' if rowwise else 'tensorwise'} -> {str(out)[6:]}"
                failed.setdefault(error, []).append(call)
    if not failed:
        return None
    calls = len(SCALED_MM_CALLS) * 2
    said = "; ".join(f"{'every call' if len(cs) == calls else ', '.join(cs)}: {error}" for error, cs in failed.items())
    return f"torch._scaled_mm has no fp8 kernel on {where(device)} ({said})"


def scaled_mm_missing(device: torch.device | str) -> str | None:
    """Why ``torch._scaled_mm`` cannot run the fp8 products the suite makes on ``device`` (which
    calls failed, on which kernel set), or None when every one runs. Probed once per device and
    implementation of ``torch._scaled_mm`` (a replaced one is probed anew)."""
    return _scaled_mm_missing(torch.device(device), getattr(torch, "_scaled_mm", None))
