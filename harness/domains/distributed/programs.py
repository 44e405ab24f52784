"""The distributed family's rank programs, run by :func:`harness.domains.engines.ranks.ranks.launch`
on every rank (``"harness.domains.distributed.programs:ddp_gradients"``): DDP compression hooks,
DDP + AMP parity, FSDP2 mixed-precision policies and sharded gradient scaling, each returning
JSON-able results for the suite to judge."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch

from harness.domains.distributed import policy as P
from harness.domains.engines.ranks import toy
from harness.domains.engines.ranks.ranks import device_mesh, rank_device, resolve
from harness.platform.compat import FULLY_SHARD

#: torch's own DDP communication hooks (``module:function`` names for the ranks to import)
DEFAULT_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"


def ddp_gradients(rank: int, world: int, hook: str, plain_hook: str | None = None) -> dict[str, Any]:
    """One backward of DDP with plain fp32 all-reduce and one with a compression hook
    (``module:function``): both averaged gradients, this rank's local gradients, and the dtypes
    each run's Python-level collectives carried (DDP's own all-reduce runs in C++: none seen).
    ``plain_hook``: the communication path of the "plain" run (None: DDP's own all-reduce; the
    harness's negative controls put a lossy one there)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device(rank)
    local = toy.model().to(dev)
    x, y = toy.batch(rank)
    torch.nn.functional.mse_loss(local(x.to(dev)), y.to(dev)).backward()  # type: ignore[no-untyped-call]
    out: dict[str, Any] = {"local": toy.grads(local)}
    for name, h in (("plain", plain_hook), ("hooked", hook)):
        ddp = DDP(toy.model().to(dev), device_ids=[rank] if dev.type == "cuda" else None)
        if h is not None:
            ddp.register_comm_hook(None, resolve(h))
        observed = P.Observed()
        with P.observe_collectives(observed):
            torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()  # type: ignore[no-untyped-call]
        out[name] = toy.grads(ddp.module)
        out[f"{name}_observed"] = observed.as_dict()
    return out


def ddp_amp_training(rank: int, world: int, steps: int, hook: str | None = None) -> dict[str, Any]:
    """DDP + fp16 autocast + GradScaler, each rank on its half of every batch: the global losses
    and the first step's unscaled gradients (:func:`_amp_loop`). ``hook``: DDP's communication
    hook (``module:function``; None: its own all-reduce)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device(rank)
    model = DDP(toy.model().to(dev), device_ids=[rank] if dev.type == "cuda" else None)
    if hook is not None:
        model.register_comm_hook(None, resolve(hook))
    return _amp_loop(model, dev, steps, lambda s: _shard(_global_batch(s), rank, world), lambda v: _mean_all(v, dist))


#: Samples per step of the data-parallel training (each of WORLD ranks gets an equal share).
GLOBAL_BATCH = 16


def _global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return toy.batch(0, step, n=GLOBAL_BATCH)


def _shard(batch: tuple[torch.Tensor, torch.Tensor], rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    return batch[0].chunk(world)[rank], batch[1].chunk(world)[rank]


def _mean_all(v: float, dist: Any) -> float:
    t = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / float(dist.get_world_size())


def _amp_loop(
    model: torch.nn.Module,
    dev: torch.device,
    steps: int,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    reduce_loss: Callable[[float], float],
) -> dict[str, Any]:
    """``steps`` steps of SGD under fp16 autocast and GradScaler: the losses, and the gradients of
    the first step taken (scaled ones divided by the scale: exact, a power of two) as lists."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(dev.type)
    losses: list[float] = []
    first: list[list[float]] | None = None
    for s in range(steps):
        x, y = batch(s)
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x.to(dev)).float(), y.to(dev))
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        scale = float(scaler.get_scale())
        grads = [(p.grad.detach().double() / scale).flatten() for p in model.parameters() if p.grad is not None]
        if first is None and all(bool(g.isfinite().all()) for g in grads):
            first = [g.cpu().tolist() for g in grads]
        scaler.step(opt)
        scaler.update()
        losses.append(reduce_loss(loss.detach().item()))
    return {"losses": losses, "first_grads": first}


def single_process_amp_training(steps: int) -> dict[str, Any]:
    """The same training in one process on the whole batch (the DDP reference)."""
    dev = torch.device("cpu")
    return _amp_loop(toy.model().to(dev), dev, steps, _global_batch, lambda v: v)


#: Modules of the distributed suite's model (:func:`harness.domains.engines.ranks.toy.model`): three linears, two tanh
MODEL_MODULES = 5


def per_sample_gradient_magnitudes(step: int = 0) -> list[torch.Tensor]:
    """sum_i |g_i| per parameter element, in float64: g_i the contribution of sample i of the
    global batch at ``step`` to the gradient of the batch's mean loss (1/B of its own gradient),
    at the initial weights; what the budget of a reordered batch reduction is a multiple of."""
    model = toy.model().double()
    x, y = _global_batch(step)
    total = [torch.zeros_like(p, dtype=torch.float64).flatten() for p in model.parameters()]
    for i in range(x.shape[0]):
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[i : i + 1].double()), y[i : i + 1].double()) / x.shape[0]
        loss.backward()  # type: ignore[no-untyped-call]
        for t, p in zip(total, model.parameters(), strict=True):
            assert p.grad is not None
            t += p.grad.flatten().abs()
    return total


def fsdp2_gradients(rank: int, world: int, reduce_dtype: str, shard: str = FULLY_SHARD) -> dict[str, Any]:
    """One forward and backward of FSDP2 (``shard``, each Linear and the root) under the policy
    param_dtype=bf16, the given reduce dtype, cast_forward_inputs=True (and output_dtype=fp32 on
    the root): the full
    averaged gradients, this rank's gradients of the same bf16 computation unsharded, and what the
    collectives carried and the modules computed in (:mod:`harness.domains.distributed.policy`)."""
    MixedPrecisionPolicy = resolve("torch.distributed.fsdp:MixedPrecisionPolicy")
    fully_shard = resolve(shard)
    dev = rank_device(rank)
    x, y = toy.batch(rank)
    local = toy.model().to(dev).to(torch.bfloat16)
    torch.nn.functional.mse_loss(local(x.to(dev, torch.bfloat16)).float(), y.to(dev)).backward()  # type: ignore[no-untyped-call]
    declared = {
        "param_dtype": "bfloat16",
        "reduce_dtype": reduce_dtype,
        "output_dtype": "float32",
        "cast_forward_inputs": True,
    }
    inner = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=getattr(torch, reduce_dtype), cast_forward_inputs=True
    )
    model = toy.model().to(dev)
    mesh = device_mesh(rank, world)
    for layer in list(model.modules()):
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=inner)
    # the output dtype on the root only: inner outputs stay bf16, as the unsharded bf16 computation's
    fully_shard(model, mesh=mesh, mp_policy=dataclasses.replace(inner, output_dtype=torch.float32))
    observed = P.Observed()
    handles = P.observe_modules(model, observed)
    with P.observe_collectives(observed):
        out = model(x.to(dev))
        torch.nn.functional.mse_loss(out, y.to(dev)).backward()  # type: ignore[no-untyped-call]
    for h in handles:
        h.remove()
    full = [p.grad.full_tensor().float().cpu().flatten().tolist() for p in model.parameters()]  # type: ignore[union-attr]
    return {"averaged": full, "local": toy.grads(local), "declared": declared, "observed": observed.as_dict()}


def sharded_scaler_step(rank: int, world: int, scaler: str, inf_ranks: list[int]) -> list[dict[str, Any]]:
    """FSDP2 + fp16 autocast: for each rank of ``inf_ranks`` in turn, an inf planted in that
    rank's gradient shard only (a fresh model and scaler per case, one process group: launching
    ranks is the cost). Every rank must skip the step and keep an identical scale."""
    fully_shard = resolve(FULLY_SHARD)
    dev = rank_device(rank)
    out = []
    for inf_rank in inf_ranks:
        model = toy.model().to(dev)
        fully_shard(model, mesh=device_mesh(rank, world))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s = resolve(scaler)(dev.type)
        x, y = toy.batch(rank)
        with torch.autocast(dev.type, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x.to(dev)).float(), y.to(dev))
        s.scale(loss).backward()
        first = next(model.parameters())
        if rank == inf_rank:
            first.grad._local_tensor.view(-1)[0] = math.inf  # type: ignore[union-attr]
        before = [p._local_tensor.detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]
        s.step(opt)
        s.update()
        stepped = any(not torch.equal(b, p._local_tensor) for b, p in zip(before, model.parameters(), strict=True))  # type: ignore[attr-defined]
        out.append({"inf_rank": inf_rank, "stepped": stepped, "scale": s.get_scale()})
    return out


def sharded_grad_scaler(device: str) -> Any:
    """torch's ShardedGradScaler (the scaler meant for sharded gradients)."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(device=device)
