"""The speed workloads: what an AMP speedup is measured on (matmuls, a linear layer's forward and
backward, attention, layer norm, a small LM's training step), each a baseline and an AMP path."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from harness.domains.engines.bench.workload import Fn, Script, Workload
from harness.domains.engines.training.models import SETUPS
from harness.domains.engines.training.sources import model_source
from harness.domains.repro import ScriptTemplate

#: The eager workloads as source text, blocks of ``scripts/speedup.py``: ``make(DEVICE, DTYPE)``
#: returning ``run()``, one iteration under autocast to DTYPE (None: fp32). The harness runs this
#: text, and a failed speed check's script (``amp-harness repro``) carries the same text, so the two
#: time one computation.
SPEEDUP = ScriptTemplate("harness.domains.speed", "speedup")
MATMUL_SOURCE = SPEEDUP.fill("matmul", imports=False)
LINEAR_SOURCE = SPEEDUP.fill("linear", imports=False)
SDPA_SOURCE = SPEEDUP.fill("sdpa", imports=False)
LAYER_NORM_SOURCE = SPEEDUP.fill("layer_norm", imports=False)
#: the tiny LM's AdamW training step (GradScaler for fp16): MODEL its seeded factory, LOSS its loss,
#: X and Y one batch
LM_STEP_SOURCE = SPEEDUP.fill("lm_step", imports=False)
#: a small transformer's AdamW training step at width D: the explainer's 2-3x training speedup from
#: tensor cores, on a step wide enough to keep a GPU busy
TRANSFORMER_STEP_SOURCE = SPEEDUP.fill("transformer_step", imports=False)


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

    setup = SETUPS["tiny_lm"]
    x, y = setup.batch(0, torch.Generator().manual_seed(0))
    return {"MODEL": setup.model, "LOSS": setup.loss, "X": x, "Y": y}


def _lm_prelude() -> tuple[str, dict[str, torch.Tensor]] | None:
    """The same names in a script: the model's and loss's source, the batch saved beside it."""

    setup = SETUPS["tiny_lm"]
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


def _laddered(
    name: str,
    source: str,
    size_name: str,
    sizes: tuple[int, ...],
    flops: Callable[[int], float],
    constants: Callable[[int], dict[str, Any]] | None = None,
) -> Workload:
    """A workload of ``source`` on a size ladder: ``size_name`` (a name in the source) takes each
    of ``sizes``, ``constants(size)`` any other names; built at ``sizes[0]``."""

    def at(size: int) -> Workload:
        names = {size_name: size, **(constants(size) if constants is not None else {})}
        w = _source(name, source, flops(size), **names)
        return dataclasses.replace(w, sizes=sizes, size_name=size_name, resize=at)

    return at(sizes[0])


def _transformer_flops(d: int, b: int = 8, s: int = 256, layers: int = 2) -> float:
    """FLOPs of one forward and backward (3x the forward) of TRANSFORMER_STEP_SOURCE: per layer the
    q, k, v, output and 4D feed-forward matmuls (24 T D^2 for T = B S tokens) and attention's scores
    and weighted sum (4 B S^2 D), then the head (2 T D^2)."""
    t = b * s
    return 3.0 * (layers * (24.0 * t * d * d + 4.0 * b * s * s * d) + 2.0 * t * d * d)


#: The rungs of the matmul ladders: powers of two up to 8192 (a 8192 fp32 matmul is 1.1 TFLOP, 16 ms
#: on an H200, seconds on a 2-core CPU: the CPU never climbs that far, its first rung is compute-bound).
_MATMUL_RUNGS = (256, 512, 1024, 2048, 4096, 8192)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        *(
            _laddered(f"matmul_{n}", MATMUL_SOURCE, "N", tuple(r for r in _MATMUL_RUNGS if r >= n), _mm_flops)
            for n in (256, 512, 1024)
        ),
        _laddered("linear_fwd_bwd", LINEAR_SOURCE, "D", (1024, 2048, 4096, 8192), lambda d: 3 * 2.0 * (d // 4) * d * d),
        _laddered("sdpa", SDPA_SOURCE, "S", (256, 512, 1024, 2048, 4096, 8192), lambda s: 2 * 2.0 * 2 * 8 * s * s * 64),
        _laddered(
            "transformer_step",
            TRANSFORMER_STEP_SOURCE,
            "D",
            (128, 256, 512, 1024, 2048),
            _transformer_flops,
            lambda d: {"B": 8, "S": 256, "LAYERS": 2},
        ),
        _source("layer_norm", LAYER_NORM_SOURCE, None, autocast_op="nn.LayerNorm"),
        Workload(
            "lm_train_step",
            _from_source(LM_STEP_SOURCE, _lm_constants),
            None,
            script=Script(LM_STEP_SOURCE, _lm_prelude),
        ),
    )
}
