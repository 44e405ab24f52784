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

from harness.domains.memory.accounting import StateModel
from harness.domains.repro import FailureRepro
from harness.domains.training import repro as training_script
from harness.domains.training.recipes import Setup

if TYPE_CHECKING:
    from harness.domains.repro import FailureRepro


def _prelude(
    setup: Setup, seed: int, batch: tuple[torch.Tensor, torch.Tensor], device: torch.device
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """The check's model (``setup.model(seed)``) as weights, and its batch (None: a model of the
    setup's own)."""
    return training_script.model_prelude(setup, setup.model(seed).state_dict(), batch, device)


def activation_repro_of(
    setup: Setup, seed: int, batch: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> FailureRepro | None:
    """The forward pass under autocast to ``dtype`` must save fewer bytes for backward than fp32."""

    prelude = _prelude(setup, seed, batch, device)
    if prelude is None:
        return None
    code, tensors = prelude
    code += f"""

def saved_bytes(low):  # bytes autograd saves for backward in the forward pass, each storage once
    seen = {{}}

    def pack(t):
        s = t.untyped_storage()
        seen[(s.data_ptr(), s.nbytes())] = s.nbytes()
        return t

    model = model_at()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(model, low)
    return sum(seen.values())


fp32, amp = saved_bytes(None), saved_bytes(torch.{str(dtype).removeprefix("torch.")})
print(f"saved for backward: fp32 {{fp32}} B, autocast {{amp}} B (ratio {{amp / fp32:.3g}})")
measured = amp  # bytes
allowed = fp32 - 1  # fewer than fp32's"""
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
    code, tensors = prelude
    code += f"""
RECIPE = {recipe!r}
# the analytic model, bytes per parameter ({model.name}): weights, gradients, master copy, Adam moments
WEIGHT_B, GRAD_B, MASTER_B, MOMENTS_B = {model.weights}, {model.grads}, {model.master}, {model.moments}

model = model_at()
if RECIPE == "master_weights":  # fp16 weights, an fp32 master copy that AdamW steps
    master = [p.detach().clone().float() for p in model.parameters()]
    model = model.half()
    params = list(model.parameters())
    opt = torch.optim.AdamW(master, lr=1e-3)
else:
    master, params = None, list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
loss_of(model, torch.bfloat16 if RECIPE == "autocast" else None).backward()
if master is not None:
    for m, p in zip(master, params):
        m.grad = p.grad.float()
    opt.step()
    for m in master:
        m.grad = None  # the fp32 gradient is transient; the fp16 one is the model state
else:
    opt.step()


def nbytes(ts):
    return sum(t.numel() * t.element_size() for t in ts)


held = nbytes(params) + nbytes(p.grad for p in params if p.grad is not None) + nbytes(master or [])
held += nbytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
n = sum(p.numel() for p in params)
expected = (WEIGHT_B + GRAD_B + MASTER_B + MOMENTS_B) * n
print(f"{{RECIPE}}: {{held}} B held for {{n}} parameters, the analytic model {{expected}} B")
measured = abs(held - expected)  # bytes off the model
allowed = 0"""
    return FailureRepro(
        "memory",
        f"{setup.name}: model-state bytes after one AdamW step ({recipe}) against {model.name}",
        code,
        f"exactly {model.per_param} B per parameter: {model.name}, from the formats' widths (no tolerance)",
        tensors,
        device=device.type,
    )
