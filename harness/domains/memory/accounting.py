"""Memory of mixed-precision training: exact saved-activation bytes, and an analytic model of the
model state (weights, gradients, fp32 master weights, optimizer moments) per recipe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.numerics.comparison import ClaimComparison, compare_claim

BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2, torch.float64: 8}


def saved_activation_bytes(step: Callable[[], Any]) -> int:
    """Bytes of the tensors autograd saves for backward while ``step()`` runs the forward pass,
    each storage counted once (device-independent: it is what backward will hold)."""
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[(storage.data_ptr(), storage.nbytes())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(seen.values())


@dataclass(frozen=True)
class StateModel:
    """Bytes per parameter of the model state of a recipe with Adam(W)."""

    name: str
    weights: int
    grads: int
    master: int
    moments: int

    @property
    def per_param(self) -> int:
        return self.weights + self.grads + self.master + self.moments

    def total(self, n_params: int) -> int:
        return self.per_param * n_params


#: fp32 training: fp32 weights and gradients, two fp32 Adam moments.
FP32_ADAM = StateModel("fp32 + Adam", 4, 4, 0, 8)
#: PyTorch autocast: parameters, gradients and moments stay fp32; low-precision weight copies exist
#: only transiently inside the autocast region (the cast cache), not in the model state.
AUTOCAST_ADAM = StateModel("autocast (fp32 params) + Adam", 4, 4, 0, 8)
#: Classic mixed precision (Micikevicius et al. 2018, Megatron/DeepSpeed fp16 optimizers): fp16
#: weights and gradients, an fp32 master copy, two fp32 moments.
MASTER_WEIGHTS_ADAM = StateModel("fp16 weights + fp32 master + Adam", 2, 2, 4, 8)
#: The source text's arithmetic: it counts one fp32 moment only.
SOURCE_TEXT_MIXED = StateModel("source text: fp16 params+grads, fp32 master, 'fp32 momentum'", 2, 2, 4, 4)


def measured_state_bytes(
    params: list[torch.Tensor], optimizer: torch.optim.Optimizer, master: list[torch.Tensor] | None = None
) -> int:
    """Bytes actually held by parameters, their gradients, the optimizer's state tensors and a
    master copy (scalars such as Adam's step counter excluded: they do not scale with the model)."""
    total = sum(p.numel() * p.element_size() for p in params)
    total += sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    for state in optimizer.state.values():
        total += sum(
            v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0
        )
    if master is not None:
        total += sum(m.numel() * m.element_size() for m in master)
    return total


# -- the claims: the family's verdicts, decided here -------------------------------------------------
def activation_claim(amp: int, fp32: int) -> ClaimComparison:
    """Autocast saves fewer bytes for backward than fp32 (``amp``, ``fp32``: the bytes
    :func:`saved_activation_bytes` counted for the same forward)."""
    ratio = amp / fp32
    return compare_claim(
        "lm.saved_activation_bytes.ratio",
        ratio,
        ratio < 1,
        "autocast saves fewer bytes for backward than fp32 (autograd saved-tensor hooks, storages counted once)",
        detail=f"autocast saved {amp} B for backward, fp32 {fp32} B: no activation saving",
        allowance=1.0,
        unit="amp/fp32",
    )


def state_claim(recipe: str, measured: int, model: StateModel, n: int) -> ClaimComparison:
    """The model state a recipe holds after a step, measured, equals the analytic model's
    bytes per parameter x ``n`` parameters, exactly."""
    return compare_claim(
        f"model_state_bytes.{recipe}",
        measured,
        measured == model.total(n),
        f"{model.name}: {model.per_param} B/param x {n}",
        detail=f"{recipe}: measured {measured} B, model {model.name} predicts {model.total(n)} B",
        expected=model.total(n),
        allowance=0,
        unit="B",
    )


#: what a widely shared explainer of mixed-precision training computes for a 7B-parameter model:
#: 112 GB of model state in fp32 and 84 GB mixed
EXPLAINER_GB = {"fp32": 112.0, "mixed": 84.0}


def seven_billion_claims(fp32: float, text_mixed: float, mixed: float, autocast: float) -> list[ClaimComparison]:
    """The explainer's 7B arithmetic reproduced from its own per-parameter bytes, and its
    correction: with fp32 master weights and both fp32 Adam moments, mixed precision keeps as much
    model state as fp32 (GB, from :data:`FP32_ADAM`, :data:`SOURCE_TEXT_MIXED`,
    :data:`MASTER_WEIGHTS_ADAM`, :data:`AUTOCAST_ADAM`)."""
    return [
        compare_claim(
            "7B.source_text_arithmetic_reproduced",
            abs(fp32 - EXPLAINER_GB["fp32"]) + abs(text_mixed - EXPLAINER_GB["mixed"]),
            fp32 == EXPLAINER_GB["fp32"] and text_mixed == EXPLAINER_GB["mixed"],
            "the explainer's own arithmetic: 112 GB in fp32 (16 B/param), 84 GB mixed (12 B/param)",
            detail=f"computed {fp32} GB and {text_mixed} GB",
            expected=0,
            allowance=0,
            unit="GB",
        ),
        compare_claim(
            "7B.mixed_model_state_equals_fp32",
            mixed - fp32,
            mixed == fp32 == autocast,
            "with fp32 master weights and both fp32 Adam moments, mixed precision keeps as much model state as "
            "fp32 (16 B/param): the claimed 25% saving comes from counting one Adam moment",
            detail=f"mixed {mixed} GB, autocast {autocast} GB, fp32 {fp32} GB",
            expected=0,
            allowance=0,
            unit="GB",
        ),
    ]
