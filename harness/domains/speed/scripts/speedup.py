"""An AMP speedup, standalone, timed as the speed check times it: the workload (matmul, a linear
layer's forward and backward, attention, layer norm, a small LM's or transformer's training
step) in fp32 and under autocast, in interleaved rounds (fp32 block, AMP block, ...), on this
thread's CPU time with torch on THREADS threads (CUDA: events after a synchronise), the median of
the rounds' ratios against the class's calibrated threshold; a failure counts only when a second
measurement confirms it.

The harness builds its workloads from the ``make`` blocks below (``harness.domains.speed.workloads``
runs their text), so a failed check's script (``harness.domains.speed.repro``) times the very
computation the check timed. As it lies here it times a 64 x 64 matmul for a few milliseconds.
"""

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

# -- parameters --
NAME = "matmul_64"  # the workload
DEVICE = torch.device("cpu")
DTYPE = torch.bfloat16  # the autocast dtype
THRESHOLD = 0.0  # the speedup the check required (its origin: the allowance, below)
ROUNDS = 3  # interleaved rounds, as the check took
BLOCK_S = 0.002  # seconds of a block
THREADS = 1  # torch's threads on a CPU: the check times torch's work on this thread, on its CPU clock
if DEVICE.type == "cpu":
    torch.set_num_threads(THREADS)
Run = Callable[[], Any]

# -- constants --
# the workload's sizes and data, as the harness builds it
N = 64  # matmul: N x N
D = 64  # linear: D // 4 x D inputs, D x D weight; transformer: width
S = 32  # attention and transformer: sequence length
B = 2  # transformer: sequences
LAYERS = 1  # transformer: layers


def MODEL(seed: int) -> torch.nn.Module:  # the LM step's model factory: a small stand-in
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 32))


def LOSS(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.flatten(0, 1), y.flatten())


X = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
Y = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(1))

# -- transformer_step --
# a small transformer's AdamW training step at width D (heads of 64, a 4D feed-forward, LAYERS
# pre-norm layers, B sequences of S tokens; GradScaler for fp16)


def make(DEVICE: torch.device, DTYPE: torch.dtype | None) -> "Run":
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(D, max(1, D // 64), 4 * D, dropout=0.0, batch_first=True, norm_first=True)
    model = torch.nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False).to(DEVICE)
    head = torch.nn.Linear(D, D).to(DEVICE)
    opt = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=1e-4)
    x = torch.randn(B, S, D, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    scaler = torch.amp.GradScaler(DEVICE.type, enabled=DTYPE is torch.float16)

    def run() -> torch.Tensor:
        opt.zero_grad()
        with torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None):
            loss: torch.Tensor = head(model(x)).float().square().mean()
        torch.autograd.backward(scaler.scale(loss))
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return run


# -- lm_step --
# the tiny LM's AdamW training step (GradScaler for fp16): MODEL its seeded factory, LOSS its loss,
# X and Y one batch; run returns the step's loss (a detached tensor: no synchronise)


def make(DEVICE: torch.device, DTYPE: torch.dtype | None) -> "Run":  # type: ignore[no-redef]  # noqa: F811
    model = MODEL(0).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = X.to(DEVICE), Y.to(DEVICE)
    scaler = torch.amp.GradScaler(DEVICE.type, enabled=DTYPE is torch.float16)

    def run() -> torch.Tensor:
        opt.zero_grad()
        with torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None):
            out = model(x)
            loss = LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), y)
        torch.autograd.backward(scaler.scale(loss))
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return run


# -- layer_norm --


def make(DEVICE: torch.device, DTYPE: torch.dtype | None) -> "Run":  # type: ignore[no-redef]  # noqa: F811
    x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    ln = torch.nn.LayerNorm(1024).to(DEVICE)

    def run() -> torch.Tensor:
        with torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None):
            out: torch.Tensor = ln(x)
            return out

    return run


# -- sdpa --


def make(DEVICE: torch.device, DTYPE: torch.dtype | None) -> "Run":  # type: ignore[no-redef]  # noqa: F811
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, S, 64, generator=g).to(DEVICE) for _ in range(3))

    def run() -> torch.Tensor:
        with torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run


# -- linear --


def make(DEVICE: torch.device, DTYPE: torch.dtype | None) -> "Run":  # type: ignore[no-redef]  # noqa: F811
    torch.manual_seed(0)
    layer = torch.nn.Linear(D, D).to(DEVICE)
    x = torch.randn(D // 4, D, device=DEVICE)

    def run() -> None:
        with torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None):
            y = layer(x)
        torch.autograd.backward(y.float().sum())

    return run


# -- matmul --


def make(DEVICE: torch.device, DTYPE: torch.dtype | None) -> "Run":  # type: ignore[no-redef]  # noqa: F811
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(N, N, generator=g).to(DEVICE), torch.randn(N, N, generator=g).to(DEVICE)

    def run() -> torch.Tensor:
        with torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None):
            return a @ b

    return run


# -- timing --


def per_call(fn: Run, n: int) -> float:  # seconds per call over n calls: this thread's CPU time (CUDA: events)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / n
    begin = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - begin) / n


def speedup() -> float:  # the median over ROUNDS of fp32's seconds per call over AMP's, blocks interleaved
    fp32, amp = make(DEVICE, None), make(DEVICE, DTYPE)
    for fn in (fp32, amp, fp32, amp):  # warm-up
        fn()
    n32, namp = (max(1, round(BLOCK_S / max(per_call(fn, 1), 1e-9))) for fn in (fp32, amp))
    return statistics.median(per_call(fp32, n32) / max(per_call(amp, namp), 1e-12) for _ in range(ROUNDS))


first = speedup()
second = speedup() if first < THRESHOLD else first  # as the check: a second measurement confirms a failure
print(f"{NAME}: AMP ({DTYPE}) over fp32 {first:.3g}x, then {second:.3g}x; required {THRESHOLD}x")
measured = THRESHOLD / max(first, second)  # how far the better measurement falls short: <= 1 meets it
allowed = 1.0
