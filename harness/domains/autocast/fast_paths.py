"""Modules whose inference takes a fused fast path under autocast: ``nn.TransformerEncoderLayer``
(``aten::_transformer_encoder_layer_fwd``) and ``nn.MultiheadAttention``
(``aten::_native_multi_head_attention``) in eval mode without autograd. A fused op calls others
inside it, and autocast must cast their operands alike: in torch 2.4 and 2.5, CPU autocast cast
``_native_multi_head_attention`` to low precision but not ``_addmm_activation``, so every encoder
layer's inference under CPU autocast raised "mat1 and mat2 must have the same dtype"
(pytorch/pytorch#132613, fixed in 2.6 by #135936). The claim: the fast path runs, was taken, and
gives finite values. The verdict is decided here; the suite states it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from harness.numerics.comparison import ClaimComparison, compare_claim

WIDTH, HEADS, FEEDFORWARD = 32, 4, 64
#: batch, sequence: batched inputs of batch_first modules (the fast path's conditions)
SHAPE = (4, 16, WIDTH)


@dataclass(frozen=True)
class FastPath:
    """A module, how its inference is called, and the fused op its fast path dispatches."""

    build: Callable[[], nn.Module]
    call: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    fused: str


def _encoder(norm_first: bool) -> Callable[[], nn.Module]:
    return lambda: nn.TransformerEncoderLayer(
        WIDTH, HEADS, FEEDFORWARD, dropout=0.0, batch_first=True, norm_first=norm_first
    )


FAST_PATHS: dict[str, FastPath] = {
    "TransformerEncoderLayer": FastPath(_encoder(False), lambda m, x: m(x), "aten::_transformer_encoder_layer_fwd"),
    "TransformerEncoderLayer.norm_first": FastPath(
        _encoder(True), lambda m, x: m(x), "aten::_transformer_encoder_layer_fwd"
    ),
    "MultiheadAttention": FastPath(
        lambda: nn.MultiheadAttention(WIDTH, HEADS, batch_first=True),
        lambda m, x: m(x, x, x, need_weights=False)[0],
        "aten::_native_multi_head_attention",
    ),
}


@dataclass(frozen=True)
class FastPathRun:
    """What one inference under autocast did: the error it raised (first line), whether the fused
    op ran (the profiler's aten events), whether every output value is finite, its dtype."""

    raised: str | None
    taken: bool
    finite: bool
    dtype: str


def run_fast_path(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> FastPathRun:
    """Module ``name`` (seeded) in eval mode under ``inference_mode`` and autocast to ``dtype``."""
    path = FAST_PATHS[name]
    torch.manual_seed(seed)
    module = path.build().to(device).eval()
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(seed)).to(device)
    raised: str | None = None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        try:
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype):
                out = path.call(module, x)
        except RuntimeError as exc:
            raised = (str(exc).strip().splitlines() or [""])[0]
            out = None
    taken = any(e.name == path.fused for e in prof.events())
    if out is None:
        return FastPathRun(raised, taken, False, "")
    return FastPathRun(None, taken, bool(out.isfinite().all()), str(out.dtype).removeprefix("torch."))


def fast_path_claim(name: str, dtype: torch.dtype, run: FastPathRun) -> ClaimComparison:
    """The fast path ran under autocast without an error and gave finite values; not taken (the
    module fell back to its slow path) is INCONCLUSIVE: the claim was not exercised."""
    low = str(dtype).removeprefix("torch.")
    problems = ([f"raised: {run.raised}"] if run.raised else []) + (
        ["non-finite values in its output"] if run.raised is None and not run.finite else []
    )
    vacuous = not problems and not run.taken
    return compare_claim(
        f"fast_path.{name}.runs_under_autocast",
        len(problems),
        not problems and run.taken,
        f"{name}'s inference fast path ({FAST_PATHS[name].fused}) runs under {low} autocast and gives finite "
        "values (a fused op's inner ops cast alike)",
        detail=(
            f"the fused op {FAST_PATHS[name].fused} was not dispatched: the module took its slow path here"
            if vacuous
            else "; ".join(problems) or f"ran, output {run.dtype}"
        ),
        expected=0,
        allowance=0,
        unit="errors",
        inconclusive=vacuous,
    )
