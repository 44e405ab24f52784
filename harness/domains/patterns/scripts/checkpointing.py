"""Activation checkpointing under autocast, standalone: three blocks of linear -> GELU -> LayerNorm
and a head, trained one step under autocast with the blocks checkpointed in VARIANT (reentrant,
non-reentrant, ``checkpoint_sequential`` or selective) and once without; the recomputation runs
in the forward's precision, so on a device whose kernels repeat the gradients must be bit for bit
those of the model without checkpointing; and with fp16 and GradScaler, an inf produced in a
checkpointed block (in the forward and its recomputation) must skip the step, parameters and
momentum bitwise as they were, and halve the scale once.

amp-harness writes a failed check's device, dtype and variant over the defaults below
(``harness.domains.patterns.repro``); the model and data are seeded, as the check builds them. As
it lies it checks non-reentrant checkpointing under bf16 autocast on the CPU.
"""

import functools
import math
from collections.abc import Callable

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
BACKEND: str | None = None  # None: eager; else both models' forward compiled with this torch.compile backend
SHARED = False  # the third block is the first again: one layer in two checkpointed regions

# -- model --


def selective_policy(ctx: object, op: object, *args: object, **kwargs: object) -> ckpt.CheckpointPolicy:
    saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)  # save the matmuls, recompute the rest
    return ckpt.CheckpointPolicy.MUST_SAVE if op in saved else ckpt.CheckpointPolicy.PREFER_RECOMPUTE


def model() -> nn.Sequential:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.LayerNorm(WIDTH)) for _ in range(BLOCKS)]
    if SHARED:
        blocks[-1] = blocks[0]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, 1)).to(DEVICE)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g).to(DEVICE), torch.randn(BATCH, 1, generator=g).to(DEVICE)
    return x.requires_grad_(True), y  # reentrant checkpointing sends gradients only through inputs that need them


def forward(m: nn.Sequential, x: torch.Tensor, variant: str | None) -> torch.Tensor:
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
    out: torch.Tensor = m[-1](h)
    return out


# -- gradients --
def gradients(variant: str | None) -> dict[str, torch.Tensor]:
    m = model()
    x, y = batch()
    run: Callable[..., torch.Tensor] = functools.partial(forward, variant=variant)
    if BACKEND is not None:  # compiled afresh: Dynamo caches per code object, and both runs compile forward
        torch._dynamo.reset()
        run = torch.compile(run, backend=BACKEND)
    with torch.autocast(DEVICE.type, dtype=DTYPE):
        out = run(m, x)
    torch.autograd.backward(nn.functional.mse_loss(out.float(), y) * SCALE)
    return {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


plain = gradients(None)  # reference: the model without checkpointing (compiled alike)
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
print(
    f"{VARIANT} checkpointing under {DTYPE} autocast{'' if BACKEND is None else f', compiled by {BACKEND}'}: "
    + (", ".join(differ) or "bitwise the unchecked gradients")
)
measured = len(differ)  # parameters whose gradients differ from the unchecked model's
allowed = 0

# -- overflow --
m = model()
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler(DEVICE.type, init_scale=SCALE)
x, y = batch()
problems = []
for overflow in (False, True):  # a warm-up step fills the momentum buffers, then the overflowing step
    opt.zero_grad(set_to_none=True)
    handle = m[1].register_forward_hook(lambda _m, _i, out: out * math.inf) if overflow else None
    before = [p.detach().clone() for p in m.parameters()]
    state = [t.clone() for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    scale_before = scaler.get_scale()
    try:
        with torch.autocast(DEVICE.type, dtype=torch.float16):
            out = forward(m, x, VARIANT)
        torch.autograd.backward(scaler.scale(nn.functional.mse_loss(out.float(), y)))
        scaler.step(opt)
        scaler.update()
    except RuntimeError as exc:  # what the step raised is the observation
        problems.append(f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")
        break
    finally:
        if handle is not None:
            handle.remove()
if not problems:
    after = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    if scale_before != SCALE or not state:
        problems.append("the warm-up step was not taken: nothing to compare the state with")
    if not all(torch.equal(b, p) for b, p in zip(before, m.parameters(), strict=True)):
        problems.append("parameters changed")
    if len(state) != len(after) or not all(torch.equal(b, a) for b, a in zip(state, after, strict=True)):
        problems.append("optimizer state changed")
    if scaler.get_scale() != scale_before * 0.5:
        problems.append(f"scale {scale_before} -> {scaler.get_scale()}")
print(f"{VARIANT}: an inf in a recomputed block: " + ("; ".join(problems) or "skipped, scale halved"))
measured = len(problems)  # promises broken
allowed = 0
