"""Distributed regressions, resolved by ``module:function`` name inside the spawned ranks.

No ``from __future__ import annotations`` here: DDP inspects a communication hook's annotations
(the bucket must be a ``dist.GradBucket``, the result a ``Future[Tensor]``) as objects.
"""

import time
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.amp.grad_scaler import GradScaler


def _allreduce_into_bucket(bucket: GradBucket, compressed: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """All-reduce a compressed copy of the bucket and copy the sum back into the bucket."""
    work = dist.all_reduce(compressed, async_op=True)
    assert work is not None
    fut = work.get_future()

    def decompress(f: torch.futures.Future[Any]) -> torch.Tensor:
        out: torch.Tensor = bucket.buffer()
        out.copy_(f.value()[0])
        return out

    out: torch.futures.Future[torch.Tensor] = fut.then(decompress)
    return out


def compress_hook_without_division(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """fp16 compression that forgets to divide by the world size: gradients W times too large."""
    return _allreduce_into_bucket(bucket, bucket.buffer().to(torch.float16))


def compress_hook_losing_mantissa(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """fp16 compression that rounds through bf16 first (3 mantissa bits lost before the all-reduce)."""
    return _allreduce_into_bucket(
        bucket, bucket.buffer().to(torch.bfloat16).to(torch.float16).div_(dist.get_world_size())
    )


class LocalInfScaler(GradScaler):
    """A sharded scaler that checks only its own shard and does not share the inf flag."""

    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    local = getattr(p.grad, "_local_tensor", p.grad)
                    local.mul_(inv_scale)
                    if not bool(torch.isfinite(local).all()):
                        found_inf.fill_(1.0)
        return {found_inf.device: found_inf}


def rank_crashes(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.barrier()  # rank 0 waits for a peer that is gone


def rank_hangs(rank: int, world: int) -> None:
    if rank == 1:
        time.sleep(3600)
