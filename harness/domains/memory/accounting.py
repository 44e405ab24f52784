"""Memory of mixed-precision training: exact saved-activation bytes, and an analytic model of the
model state (weights, gradients, fp32 master weights, optimizer moments) per recipe."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

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
