"""The known answers' computations: fixed mixed-precision computations on a card's low-precision
units (bf16 and fp16 GEMMs through linear, addmm and bmm, attention, layer_norm, softmax, fp8
scaled matmul, one GradScaler'd transformer step), each run deterministically (one CPU thread, deterministic
algorithms) on inputs drawn from a fixed seed, so that a healthy card of one hardware class and
software stack gives the same bits every time. A card that does not (a stuck lane, a flipped bit)
is found by comparing its outputs bitwise with the answers a healthy card recorded.

This module imports torch and the standard library only: a failed check's script carries the
computation that disagreed as its source (``repro.py``), and the burn-in loops these functions.
"""

import contextlib
import os
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

SEED = 20261207  # every input is drawn from this seed, on the CPU, then moved to the device


def _draw(device: torch.device, dtype: torch.dtype, *shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(s, generator=g).to(dtype).to(device) for s in shapes]


def linear(device: torch.device, low: torch.dtype) -> torch.Tensor:  # autocast's linear: addmm
    x, w, b = _draw(device, torch.float32, (64, 128), (96, 128), (96,))
    with torch.autocast(device.type, dtype=low):
        return F.linear(x, w, b)


def addmm(device: torch.device, low: torch.dtype) -> torch.Tensor:  # a GEMM on low-precision operands
    c, a, b = _draw(device, low, (64, 80), (64, 96), (96, 80))
    return torch.addmm(c, a, b)


def bmm(device: torch.device, low: torch.dtype) -> torch.Tensor:  # batched GEMM
    a, b = _draw(device, low, (4, 32, 48), (4, 48, 72))
    return torch.bmm(a, b)


def sdpa(device: torch.device, low: torch.dtype) -> torch.Tensor:  # attention in low precision
    q, k, v = _draw(device, low, (2, 4, 32, 16), (2, 4, 32, 16), (2, 4, 32, 16))
    return F.scaled_dot_product_attention(q, k, v)


def layer_norm(device: torch.device, low: torch.dtype) -> torch.Tensor:  # autocast's fp32 op
    x, w, b = _draw(device, low, (64, 96), (96,), (96,))
    with torch.autocast(device.type, dtype=low):
        return F.layer_norm(x, (96,), w, b)


def softmax(device: torch.device, low: torch.dtype) -> torch.Tensor:  # a reduction in low precision
    (x,) = _draw(device, low, (64, 96))
    return F.softmax(x, dim=-1)


def scaled_mm(device: torch.device, low: torch.dtype) -> torch.Tensor:  # fp8 GEMM, per-tensor scales
    a, b = _draw(device, torch.float32, (32, 64), (48, 64))
    one = torch.ones((), device=device)
    return torch._scaled_mm(a.to(low), b.to(low).t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def scaled_step(device: torch.device, low: torch.dtype) -> torch.Tensor:  # one GradScaler'd step
    torch.manual_seed(SEED)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    model = nn.Sequential(layer, nn.Flatten(), nn.Linear(8 * 32, 1)).to(device)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8)
    x, y = _draw(device, torch.float32, (4, 8, 32), (4, 1))
    with torch.autocast(device.type, dtype=low):
        loss = F.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
    scaler.step(sgd)
    scaler.update()
    params = [p.detach().flatten() for p in model.parameters()]
    return torch.cat([loss.detach().reshape(1), *params, scaler.get_scale() * torch.ones(1, device=device)])


#: name -> (computation, low-precision dtype)
COMPUTATIONS: dict[str, tuple[Callable[[torch.device, torch.dtype], torch.Tensor], torch.dtype]] = {
    "linear_bf16": (linear, torch.bfloat16),
    "linear_fp16": (linear, torch.float16),
    "addmm_bf16": (addmm, torch.bfloat16),
    "addmm_fp16": (addmm, torch.float16),
    "bmm_bf16": (bmm, torch.bfloat16),
    "bmm_fp16": (bmm, torch.float16),
    "sdpa_bf16": (sdpa, torch.bfloat16),
    "layer_norm_bf16": (layer_norm, torch.bfloat16),
    "softmax_bf16": (softmax, torch.bfloat16),
    "scaled_mm_e4m3": (scaled_mm, torch.float8_e4m3fn),
    "scaled_step_fp16": (scaled_step, torch.float16),
}


@contextlib.contextmanager
def deterministic(device: torch.device) -> Iterator[None]:
    """One CPU thread and deterministic algorithms inside (on CUDA, cuBLAS's fixed workspace, which
    must be set before its first GEMM: a process that ran one before may still reduce differently)."""
    threads, was = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)
        torch.set_num_threads(threads)


def run(
    fn: Callable[[torch.device, torch.dtype], torch.Tensor], low: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``fn`` in ``low`` on ``device``, deterministically, its output on the CPU."""
    with deterministic(device):
        out = fn(device, low)
    return out.detach().cpu().contiguous()


def answer(name: str, device: torch.device) -> torch.Tensor:
    """The computation ``name`` on ``device``, deterministically, its output on the CPU."""
    fn, low = COMPUTATIONS[name]
    return run(fn, low, device)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers of its width (NaNs compare by their bits too)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view).flatten()
