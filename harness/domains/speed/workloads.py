"""The speed workloads: what an AMP speedup is measured on (matmuls, a linear layer's forward and
backward, attention, layer norm, a small LM's training step), each a baseline and an AMP path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Fn = Callable[[], Any]


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
    #: the text ``make`` was built from (``make(DEVICE, DTYPE)`` returning ``run``), with the
    #: constants it reads: what a failed check's script times (None: no script, e.g. the LM step)
    source: str | None = None
    constants: tuple[tuple[str, Any], ...] = ()

    def missing(self, device: torch.device) -> str | None:
        """Why this workload cannot run on ``device``, or None."""
        return self.unavailable(device) if self.unavailable is not None else None

    def pair(self, device: torch.device, dtype: torch.dtype) -> tuple[Fn, Fn]:
        """(baseline, AMP path): the two functions timed interleaved; the speedup is their ratio."""
        base = self.baseline(device, dtype) if self.baseline is not None else self.make(device, None)
        return base, self.make(device, dtype)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> Any:
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


#: The eager workloads as source text: ``make(DEVICE, DTYPE)`` returning ``run()``, one iteration
#: under autocast to DTYPE (None: fp32). The harness runs this text, and a failed speed check's
#: script (``amp-harness repro``) carries the same text, so the two time one computation.
_AUTOCAST = "torch.autocast(DEVICE.type, dtype=DTYPE or torch.bfloat16, enabled=DTYPE is not None)"
MATMUL_SOURCE = f"""def make(DEVICE, DTYPE):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(N, N, generator=g).to(DEVICE), torch.randn(N, N, generator=g).to(DEVICE)

    def run():
        with {_AUTOCAST}:
            return a @ b

    return run
"""
LINEAR_SOURCE = f"""def make(DEVICE, DTYPE):
    torch.manual_seed(0)
    layer = torch.nn.Linear(1024, 1024).to(DEVICE)
    x = torch.randn(256, 1024, device=DEVICE)

    def run():
        with {_AUTOCAST}:
            y = layer(x)
        y.float().sum().backward()

    return run
"""
SDPA_SOURCE = f"""def make(DEVICE, DTYPE):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 256, 64, generator=g).to(DEVICE) for _ in range(3))

    def run():
        with {_AUTOCAST}:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return run
"""
LAYER_NORM_SOURCE = f"""def make(DEVICE, DTYPE):
    x = torch.randn(4096, 1024, generator=torch.Generator().manual_seed(0)).to(DEVICE)
    ln = torch.nn.LayerNorm(1024).to(DEVICE)

    def run():
        with {_AUTOCAST}:
            return ln(x)

    return run
"""


def _from_source(source: str, constants: dict[str, Any]) -> Callable[[torch.device, torch.dtype | None], Fn]:
    """``source``'s ``make``, with torch, F and ``constants`` (e.g. N) in its globals."""
    namespace: dict[str, Any] = {"torch": torch, "F": F, **constants}
    exec(compile(source, "<amp-harness speed workload>", "exec"), namespace)
    make: Callable[[torch.device, torch.dtype | None], Fn] = namespace["make"]
    return make


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


def _source(name: str, source: str, flops: float | None, autocast_op: str | None = None, **constants: Any) -> Workload:
    return Workload(
        name,
        _from_source(source, constants),
        flops,
        autocast_op=autocast_op,
        source=source,
        constants=tuple(constants.items()),
    )


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        _source("matmul_256", MATMUL_SOURCE, _mm_flops(256), N=256),
        _source("matmul_512", MATMUL_SOURCE, _mm_flops(512), N=512),
        _source("matmul_1024", MATMUL_SOURCE, _mm_flops(1024), N=1024),
        _source("linear_fwd_bwd", LINEAR_SOURCE, 3 * 2.0 * 256 * 1024 * 1024),
        _source("sdpa", SDPA_SOURCE, 2 * 2.0 * 2 * 8 * 256 * 256 * 64),
        _source("layer_norm", LAYER_NORM_SOURCE, None, autocast_op="nn.LayerNorm"),
        Workload("lm_train_step", _lm_step, None),
    )
}
