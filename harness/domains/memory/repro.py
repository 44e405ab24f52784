"""The memory checks as scripts: the built-in model's source and weights, the forward pass or
training step the check takes, and the bytes counted as the check counts them.

Bytes are exact, so these scripts are exact too: the saved-activation claim compares the bytes
autograd saves under autocast with fp32's, each storage counted once; the model-state claim
compares parameters, gradients, optimizer state and a master copy with the analytic model's
bytes per parameter, written in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness.domains.engines.training.recipes import Setup
from harness.domains.engines.training.sources import model_prelude
from harness.domains.memory.accounting import StateModel
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src

if TYPE_CHECKING:
    from harness.domains.repro import FailureRepro


#: the memory claims, standalone: ``scripts/bytes.py``, after the one-step opening of training's
BYTES = ScriptTemplate(__package__ or "harness.domains.memory", "bytes")


def _prelude(
    setup: Setup, seed: int, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """The check's model (``setup.model(seed)``) as weights, and its batch (None: a model of the
    setup's own)."""
    return model_prelude(setup, setup.model(seed).state_dict(), batch, device)


def activation_repro_of(
    setup: Setup, seed: int, batch: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> FailureRepro | None:
    """The forward pass under autocast to ``dtype`` must save fewer bytes for backward than fp32."""

    prelude = _prelude(setup, seed, batch, device)
    if prelude is None:
        return None
    opening, tensors = prelude
    tail = BYTES.fill("activations", imports=False, values={"LOW": dtype_src(dtype)})
    code = f"{opening}\n\n\n{tail}"
    return FailureRepro(
        "memory",
        f"{setup.name}: bytes saved for backward under {str(dtype).removeprefix('torch.')} autocast, against fp32",
        code,
        "fewer bytes than fp32 (autocast's low-precision activations; exact counts, no tolerance)",
        tensors,
        device=device.type,
    )


def state_repro_of(
    setup: Setup,
    seed: int,
    batch: tuple[torch.Tensor, torch.Tensor],
    recipe: str,
    model: StateModel,
    device: torch.device,
) -> FailureRepro | None:
    """One AdamW step of ``recipe`` ("fp32", "autocast", "master_weights"): the bytes of the model
    state against ``model``'s bytes per parameter."""

    prelude = _prelude(setup, seed, batch, device)
    if prelude is None:
        return None
    opening, tensors = prelude
    values = {
        "RECIPE": repr(recipe),
        "WEIGHT_B": repr(model.weights),
        "GRAD_B": repr(model.grads),
        "MASTER_B": repr(model.master),
        "MOMENTS_B": repr(model.moments),
    }
    code = f"{opening}\n\n\n{BYTES.fill('state', values=values)}"
    return FailureRepro(
        "memory",
        f"{setup.name}: model-state bytes after one AdamW step ({recipe}) against {model.name}",
        code,
        f"exactly {model.per_param} B per parameter: {model.name}, from the formats' widths (no tolerance)",
        tensors,
        device=device.type,
    )
