"""The patterns family's rank programs (``"harness.domains.patterns.rank_programs:..."``): AMP
gradient accumulation under DDP's ``no_sync`` and activation checkpointing under FSDP2, each
with the seam its negative controls swap (:data:`NO_SYNC`, :data:`CHECKPOINT`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from harness.domains.engines.ranks import toy
from harness.domains.engines.ranks.ranks import device_mesh, rank_device, resolve
from harness.domains.patterns.checkpointing import TableNet
from harness.platform.compat import FULLY_SHARD


def no_sync_but_last(ddp: Any, micro: int, micro_batches: int) -> Any:
    """The AMP examples' accumulation under DDP: ``no_sync()`` on every micro-batch but the last,
    whose backward all-reduces the accumulated gradients."""
    import contextlib

    return ddp.no_sync() if micro < micro_batches - 1 else contextlib.nullcontext()


NO_SYNC = f"{__name__}:no_sync_but_last"


def ddp_no_sync_accumulation(
    rank: int, world: int, micro_batches: int, cases: list[list[int] | None], sync: str = NO_SYNC
) -> list[dict[str, Any]]:
    """DDP + fp16 autocast + GradScaler, ``micro_batches`` micro-batches accumulated per effective
    batch with ``sync(ddp, micro, micro_batches)`` around each backward (default: ``no_sync()`` but
    the last). Per case (None: clean; ``[rank, micro]``: an inf in that rank's micro-batch), a fresh
    model: this rank's scale after each micro-batch, its gradients after ``unscale_`` (float64), the
    float64 sum of its micro-batches' own gradients (each from its own backward of the plain model)
    and of their magnitudes, and whether the step changed anything."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = rank_device(rank)
    context = resolve(sync)
    scale = 2.0**10
    out = []
    for case in cases:
        plain = toy.model().to(dev)
        batches = []
        for i in range(micro_batches):
            x, y = toy.batch(rank, step=i, n=4)
            if case is not None and case == [rank, i]:
                x[0, 0] = math.inf
            batches.append((x.to(dev), y.to(dev)))
        own = []
        for x, y in batches:  # the reference: each micro-batch's gradient from its own backward, unscaled
            plain.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(plain(x).float(), y) / micro_batches
            (loss * scale).backward()  # type: ignore[no-untyped-call]
            own.append(torch.cat([p.grad.detach().double().flatten().cpu() for p in plain.parameters()]) / scale)  # type: ignore[union-attr]
        stacked = torch.stack(own)
        ddp = DDP(toy.model().to(dev))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        scaler = torch.amp.GradScaler(dev.type, init_scale=scale, growth_interval=1000)
        scales = []
        for i, (x, y) in enumerate(batches):
            with context(ddp, i, micro_batches):
                with torch.autocast(dev.type, dtype=torch.float16):
                    loss = torch.nn.functional.mse_loss(ddp(x).float(), y) / micro_batches
                scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
            scales.append(float(scaler.get_scale()))
        scaler.unscale_(opt)
        grads = torch.cat([p.grad.detach().double().flatten().cpu() for p in ddp.parameters()])  # type: ignore[union-attr]
        before = [p.detach().clone() for p in ddp.parameters()]
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(b, p) for b, p in zip(before, ddp.parameters(), strict=True))
        out.append(
            {
                "case": case,
                "device": str(dev),
                "scales": scales,
                "scale_after": float(scaler.get_scale()),
                "grads": grads.tolist(),
                "own_sum": stacked.sum(0).tolist(),
                "own_abs_sum": stacked.abs().sum(0).tolist(),
                "stepped": stepped,
                "momentum": bool(opt.state),
            }
        )
    return out


#: The checkpoint function FSDP2's checkpointed blocks run through (the negative controls swap it).
CHECKPOINT = "torch.utils.checkpoint:checkpoint"


def fsdp2_checkpointed_gradients(rank: int, world: int, dtype: str, checkpoint: str = CHECKPOINT) -> dict[str, Any]:
    """FSDP2 with checkpointed units (non-reentrant, as FSDP2 recipes do), once with and once
    without the checkpointing, in two forms: ``autocast`` (each Linear a unit under ``dtype``
    autocast, every hidden Linear + Tanh pair checkpointed through ``checkpoint``) and ``policy``
    (``MixedPrecisionPolicy(param_dtype=dtype)``, each block of a :class:`~harness.domains.patterns.
    checkpointing.TableNet` a unit that gets an fp32 table from its parent, the blocks checkpointed
    as Hugging Face's gradient checkpointing wraps its layers). Per form, this rank's shards of the
    averaged gradients, flattened, or what the checkpointed backward raised."""
    fully_shard = resolve(FULLY_SHARD)
    policy = resolve("torch.distributed.fsdp:MixedPrecisionPolicy")  # where FULLY_SHARD lives
    ckpt = resolve(checkpoint)
    dev = rank_device(rank)
    low = getattr(torch, dtype)
    out: dict[str, Any] = {"device": str(dev), "autocast": {}, "policy": {}}
    for name, checkpointed in (("checkpointed", True), ("plain", False)):
        model = toy.model().to(dev)
        assert isinstance(model, torch.nn.Sequential)
        mesh = device_mesh(rank, world)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, y = toy.batch(rank)
        x, y = x.to(dev).requires_grad_(True), y.to(dev)
        try:
            with torch.autocast(dev.type, dtype=low):
                h = x
                layers = list(model)
                for i in range(0, len(layers) - 1, 2):  # (Linear, Tanh) pairs, then the head
                    pair = torch.nn.Sequential(layers[i], layers[i + 1])
                    h = ckpt(pair, h, use_reentrant=False) if checkpointed else pair(h)
                result = layers[-1](h)
            torch.nn.functional.mse_loss(result.float(), y).backward()  # type: ignore[no-untyped-call]
        except RuntimeError as exc:  # a recompute that fails its metadata check: the observation
            out["autocast"][name] = {"raised": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        else:
            out["autocast"][name] = {"grads": _shards(model)}
        net = TableNet(ckpt if checkpointed else None).to(dev)
        mixed = policy(param_dtype=low, reduce_dtype=torch.float32)
        for block in net.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mixed)
        fully_shard(net, mesh=mesh, mp_policy=mixed)
        try:
            torch.nn.functional.mse_loss(net(x.detach()).float(), y[:, :1]).backward()  # type: ignore[no-untyped-call]
        except RuntimeError as exc:
            out["policy"][name] = {"raised": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        else:
            out["policy"][name] = {"grads": _shards(net)}
    return out


def _shards(model: torch.nn.Module) -> list[list[float]]:
    """This rank's shard of each parameter's averaged gradient, flattened."""
    return [p.grad._local_tensor.float().flatten().tolist() for p in model.parameters()]  # type: ignore[union-attr]
