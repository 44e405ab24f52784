"""The memory claims of one model, standalone and exact: the bytes autograd saves for backward in
a forward pass under autocast against fp32's (each storage counted once), and the model state's
bytes after one AdamW step (parameters, gradients, optimizer state, a master copy) against the
analytic model's bytes per parameter.

amp-harness opens a failed check's script with the model, weights and batch of
``harness/domains/engines/training/scripts/one_step.py`` (``model_at``, ``loss_of``) and keeps the block
its check needs (``harness.domains.memory.repro``); the opening here stands in for it, on a small
MLP, so that the file runs as it lies.
"""

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

# -- opening --
_gen = torch.Generator().manual_seed(0)
x, y = torch.randn(64, 32, generator=_gen), torch.randn(64, 1, generator=_gen)


def model_at() -> nn.Module:  # the default model: a small MLP
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 1))


def loss_of(model: nn.Module, low: torch.dtype | None) -> torch.Tensor:  # the batch's loss, autocast to low
    with torch.autocast("cpu", dtype=low or torch.bfloat16, enabled=low is not None):
        out = model(x)
        return F.mse_loss(out.float(), y)


# -- activations --
LOW = torch.bfloat16  # the autocast dtype


def saved_bytes(low: torch.dtype | None) -> int:  # bytes autograd saves for backward, each storage once
    seen = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        seen[(s.data_ptr(), s.nbytes())] = s.nbytes()
        return t

    model = model_at()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of(model, low)
    return sum(seen.values())


fp32, amp = saved_bytes(None), saved_bytes(LOW)
print(f"saved for backward: fp32 {fp32} B, autocast {amp} B (ratio {amp / fp32:.3g})")
measured = amp  # bytes
allowed = fp32 - 1  # fewer than fp32's

# -- state --
RECIPE = "autocast"  # fp32, autocast, or master_weights
# the analytic model, bytes per parameter: weights, gradients, master copy, Adam moments
WEIGHT_B = 4
GRAD_B = 4
MASTER_B = 0
MOMENTS_B = 8

model = model_at()
master: list[torch.Tensor] | None = None
if RECIPE == "master_weights":  # fp16 weights, an fp32 master copy that AdamW steps
    master = [p.detach().clone().float() for p in model.parameters()]
    model = model.half()
    params = list(model.parameters())
    opt = torch.optim.AdamW(master, lr=1e-3)
else:
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
torch.autograd.backward(loss_of(model, torch.bfloat16 if RECIPE == "autocast" else None))
if master is not None:
    for m, p in zip(master, params, strict=True):
        m.grad = p.grad.float() if p.grad is not None else None
    opt.step()
    for m in master:
        m.grad = None  # the fp32 gradient is transient; the fp16 one is the model state
else:
    opt.step()


def nbytes(ts: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


held = nbytes(params) + nbytes(p.grad for p in params if p.grad is not None) + nbytes(master or [])
held += nbytes(v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
n = sum(p.numel() for p in params)
expected = (WEIGHT_B + GRAD_B + MASTER_B + MOMENTS_B) * n
print(f"{RECIPE}: {held} B held for {n} parameters, the analytic model {expected} B")
measured = abs(held - expected)  # bytes off the model
allowed = 0
