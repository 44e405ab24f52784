"""The speed workloads: what an AMP speedup is measured on (matmuls, a linear layer's forward and
backward, attention, layer norm, a small LM's training step), each a baseline and an AMP path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from harness.domains import training as T
from harness.domains.training.repro import model_source

Fn = Callable[[], Any]


@dataclass(frozen=True)
class Script:
    """A workload as text: ``source`` defines ``make(DEVICE, DTYPE)`` returning ``run``, reading
    names that ``prelude()`` defines in a script, as source text and tensors saved beside it (None:
    the names cannot be written out)."""

    source: str
    prelude: Callable[[], tuple[str, dict[str, torch.Tensor]] | None]


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
    #: what a failed check's script times: the text ``make`` was built from (None: no script)
    script: Script | None = None

    def missing(self, device: torch.device) -> str | None:
        """Why this workload cannot run on ``device``, or None."""
        return self.unavailable(device) if self.unavailable is not None else None

    def pair(self, device: torch.device, dtype: torch.dtype) -> tuple[Fn, Fn]:
        """(baseline, AMP path): the two functions timed interleaved; the speedup is their ratio."""
        base = self.baseline(device, dtype) if self.baseline is not None else self.make(device, None)
        return base, self.make(device, dtype)


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


#: The tiny LM's AdamW training step (GradScaler for fp16): MODEL is its seeded factory, LOSS its
#: loss, X and Y one batch. ``run`` returns the step's loss (a detached tensor: no synchronise).
LM_STEP_SOURCE = f"""def make(DEVICE, DTYPE):
    model = MODEL(0).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = X.to(DEVICE), Y.to(DEVICE)
    scaler = torch.amp.GradScaler(DEVICE.type, enabled=DTYPE is torch.float16)

    def run():
        opt.zero_grad()
        with {_AUTOCAST}:
            out = model(x)
            loss = LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss.detach()

    return run
"""


def _from_source(
    source: str, constants: Callable[[], dict[str, Any]]
) -> Callable[[torch.device, torch.dtype | None], Fn]:
    """``source``'s ``make``, with torch, F and ``constants()`` (e.g. N) in its globals."""

    def make(device: torch.device, dtype: torch.dtype | None) -> Fn:
        namespace: dict[str, Any] = {"torch": torch, "F": F, **constants()}
        exec(compile(source, "<amp-harness speed workload>", "exec"), namespace)
        run: Fn = namespace["make"](device, dtype)
        return run

    return make


def _lm_constants() -> dict[str, Any]:
    """The tiny LM's factory and loss, and batch 0 of its data, as the harness trains them."""

    setup = T.SETUPS["tiny_lm"]
    x, y = setup.batch(0, torch.Generator().manual_seed(0))
    return {"MODEL": setup.model, "LOSS": setup.loss, "X": x, "Y": y}


def _lm_prelude() -> tuple[str, dict[str, torch.Tensor]] | None:
    """The same names in a script: the model's and loss's source, the batch saved beside it."""

    setup = T.SETUPS["tiny_lm"]
    source = model_source(setup)
    if source is None:
        return None
    constants = _lm_constants()
    text = f"from torch import nn\n\n{source}\n\n\nMODEL = {setup.model.__name__}  # the tiny LM, seeded\n"
    return text, {"X": constants["X"], "Y": constants["Y"]}


def _mm_flops(n: int) -> float:
    return 2.0 * n**3


def _source(name: str, source: str, flops: float | None, autocast_op: str | None = None, **constants: Any) -> Workload:
    """A workload from ``source`` whose other names are the literals ``constants`` (e.g. N)."""
    prelude = "".join(f"{k} = {v!r}\n" for k, v in constants.items())
    script = Script(source, lambda: (prelude, {}))
    return Workload(name, _from_source(source, lambda: constants), flops, autocast_op=autocast_op, script=script)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        _source("matmul_256", MATMUL_SOURCE, _mm_flops(256), N=256),
        _source("matmul_512", MATMUL_SOURCE, _mm_flops(512), N=512),
        _source("matmul_1024", MATMUL_SOURCE, _mm_flops(1024), N=1024),
        _source("linear_fwd_bwd", LINEAR_SOURCE, 3 * 2.0 * 256 * 1024 * 1024),
        _source("sdpa", SDPA_SOURCE, 2 * 2.0 * 2 * 8 * 256 * 256 * 64),
        _source("layer_norm", LAYER_NORM_SOURCE, None, autocast_op="nn.LayerNorm"),
        Workload(
            "lm_train_step",
            _from_source(LM_STEP_SOURCE, _lm_constants),
            None,
            script=Script(LM_STEP_SOURCE, _lm_prelude),
        ),
    )
}
