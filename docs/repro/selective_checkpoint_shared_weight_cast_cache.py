# Reproduces selective-checkpoint-shared-weight-cast-cache (torch 2.13 on, open (last verified 2.15); cpu, cuda).
# a layer used in two selectively checkpointed regions of one autocast forward (a shared layer,
# tied weights): the second region's forward takes autocast's cached weight cast, its
# recomputation casts, and SAC's replay raises 'aten._to_copy.default ... not found in storage'
# Where: pytorch/pytorch#193338 (open). Registered in amp-harness
# harness/domains/patterns/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python selective_checkpoint_shared_weight_cast_cache.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

import sys

import torch
from torch.utils import checkpoint as ckpt

# Selective activation checkpointing (matmuls saved, the rest recomputed) of a module used in two
# checkpointed regions of one autocast forward: a shared layer, tied weights. Autocast's weight
# cache serves the second region's forward the cast the first region made, so that region records
# no cast; its recomputation in backward, with the cache gone, casts, and SAC's replay stops with
# "aten._to_copy.default ... not found in storage". Reference: the model without checkpointing,
# whose gradients the checkpointed one must give bit for bit (plain non-reentrant checkpointing
# does).


def policy(ctx: object, op: object, *args: object, **kwargs: object) -> ckpt.CheckpointPolicy:
    saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return ckpt.CheckpointPolicy.MUST_SAVE if op in saved else ckpt.CheckpointPolicy.PREFER_RECOMPUTE


torch.manual_seed(0)
linear, norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)
x = torch.randn(8, 16).requires_grad_(True)


def block(h: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = norm(torch.nn.functional.gelu(linear(h)))
    return out


def contexts() -> tuple[object, object]:  # save the matmuls, recompute the rest
    return ckpt.create_selective_checkpoint_contexts(policy)  # type: ignore[no-untyped-call,no-any-return]


def gradients(dtype: torch.dtype, checkpointed: bool) -> list[torch.Tensor]:
    for t in (linear.weight, linear.bias, norm.weight, norm.bias, x):
        t.grad = None
    with torch.autocast("cpu", dtype=dtype):
        h = x
        for _ in range(2):  # the same layer in two checkpointed regions
            h = ckpt.checkpoint(block, h, use_reentrant=False, context_fn=contexts) if checkpointed else block(h)  # type: ignore[arg-type]
        loss = h.float().pow(2).mean()
    torch.autograd.backward(loss)
    return [t.grad.clone() for t in (linear.weight, linear.bias, norm.weight, norm.bias, x)]  # type: ignore[union-attr]


outcome = {}
for dtype in (torch.bfloat16, torch.float16):
    try:
        same = all(torch.equal(a, b) for a, b in zip(gradients(dtype, False), gradients(dtype, True), strict=True))
        outcome[str(dtype)] = "bit for bit" if same else "gradients differ"
    except RuntimeError as exc:
        outcome[str(dtype)] = "backward raised: " + (str(exc).strip().splitlines() or [""])[0][:160]
print(f"a layer in two selectively checkpointed regions under CPU autocast: {outcome}")
sys.exit(0 if all(v == "bit for bit" for v in outcome.values()) else 1)
