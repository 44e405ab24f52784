"""Activation checkpointing under autocast, standalone: three blocks of linear -> GELU -> LayerNorm
and a head, trained one step under autocast with the blocks checkpointed in VARIANT (reentrant,
non-reentrant, ``checkpoint_sequential`` or selective) and once without; the recomputation runs
in the forward's precision, so on a device whose kernels repeat the gradients must be bit for bit
those of the model without checkpointing.

amp-harness writes a failed check's device, dtype and variant over the defaults below
(``harness.domains.patterns.repro``); the model and data are seeded, as the check builds them. As
it lies it checks non-reentrant checkpointing under bf16 autocast on the CPU.
"""

import functools
import math

import torch
from torch import nn
from torch.utils import checkpoint as ckpt

# -- parameters --
DEVICE = torch.device("cpu")
DTYPE = torch.bfloat16  # the autocast dtype
VARIANT = "non_reentrant"  # reentrant, non_reentrant, sequential or selective
WIDTH = 32  # the blocks' width
BLOCKS = 3  # blocks checkpointed
BATCH = 16  # samples
SCALE = 1.0  # the loss scale (a power of two: fp16's first GradScaler step, else 1)

# -- checkpointing --


def selective_policy(ctx: object, op: object, *args: object, **kwargs: object) -> ckpt.CheckpointPolicy:
    saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)  # save the matmuls, recompute the rest
    return ckpt.CheckpointPolicy.MUST_SAVE if op in saved else ckpt.CheckpointPolicy.PREFER_RECOMPUTE


def gradients(variant: str | None) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.LayerNorm(WIDTH)) for _ in range(BLOCKS)]
    m = nn.Sequential(*blocks, nn.Linear(WIDTH, 1)).to(DEVICE)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g).to(DEVICE), torch.randn(BATCH, 1, generator=g).to(DEVICE)
    x.requires_grad_(True)  # reentrant checkpointing sends gradients only through inputs that need them
    with torch.autocast(DEVICE.type, dtype=DTYPE):
        h = x
        body = list(m)[:-1]
        if variant is None:
            for b in body:
                h = b(h)
        elif variant == "sequential":
            h = ckpt.checkpoint_sequential(nn.Sequential(*body), 2, h, use_reentrant=False)  # type: ignore[no-untyped-call]
        elif variant == "selective":
            contexts = functools.partial(ckpt.create_selective_checkpoint_contexts, selective_policy)
            for b in body:
                h = ckpt.checkpoint(b, h, use_reentrant=False, context_fn=contexts)
        else:
            for b in body:
                h = ckpt.checkpoint(b, h, use_reentrant=variant == "reentrant")
        out = m[-1](h)
    torch.autograd.backward(nn.functional.mse_loss(out.float(), y) * SCALE)
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


plain = gradients(None)  # reference: the model without checkpointing
try:
    checked = gradients(VARIANT)
    differ = [
        n
        for n in sorted(plain.keys() | checked.keys())
        if n not in plain
        or n not in checked
        or not torch.equal(plain[n].nan_to_num(math.pi), checked[n].nan_to_num(math.pi))
    ]
except RuntimeError as exc:  # a recomputation that fails its own checks (another dtype met) is the defect
    differ = [f"the checkpointed backward raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"]
print(f"{VARIANT} checkpointing under {DTYPE} autocast: " + (", ".join(differ) or "bitwise the unchecked gradients"))
measured = len(differ)  # parameters whose gradients differ from the unchecked model's
allowed = 0
