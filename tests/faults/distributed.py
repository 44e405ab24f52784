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


def every_rank_hangs(rank: int, world: int) -> None:
    """Every rank of the world stops making progress (a deadlock in user code, a stalled filesystem)."""
    time.sleep(3600)


def uncompressed_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A "compression" hook that silently does not compress: it all-reduces the fp32 bucket
    (divided by the world size). Its gradients are exact; its declared fp16 is not what it sends."""
    return _allreduce_into_bucket(bucket, bucket.buffer().div(dist.get_world_size()))


def fully_shard_ignoring_reduce_dtype(module: torch.nn.Module, **kwargs: Any) -> Any:
    """FSDP2 that drops the declared reduce dtype: gradients are reduced in the parameter dtype."""
    import dataclasses

    from torch.distributed.fsdp import fully_shard

    kwargs["mp_policy"] = dataclasses.replace(kwargs["mp_policy"], reduce_dtype=None)
    return fully_shard(module, **kwargs)


def fully_shard_ignoring_output_dtype(module: torch.nn.Module, **kwargs: Any) -> Any:
    """FSDP2 that drops the declared output dtype: the root returns the parameter dtype."""
    import dataclasses

    from torch.distributed.fsdp import fully_shard

    kwargs["mp_policy"] = dataclasses.replace(kwargs["mp_policy"], output_dtype=None)
    return fully_shard(module, **kwargs)


def fully_shard_with_lossy_reduce_scatter(module: torch.nn.Module, **kwargs: Any) -> Any:
    """FSDP2 whose reduce-scatter input is rounded through fp8 (e4m3) on the way: the declared
    dtypes are all carried, but the reduced gradients lose far more than the declared reduce
    dtype allows."""
    from torch.distributed.fsdp import fully_shard

    original = dist.reduce_scatter_single
    if not getattr(original, "lossy", False):

        def lossy(output: torch.Tensor, input: torch.Tensor, *args: Any, **kw: Any) -> Any:
            with torch.no_grad():
                input.copy_(input.to(torch.float8_e4m3fn).to(input.dtype))
            return original(output, input, *args, **kw)

        lossy.lossy = True  # type: ignore[attr-defined]
        dist.reduce_scatter_single = lossy
    return fully_shard(module, **kwargs)


def local_gradients_only_hook(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A communication hook that never communicates: each rank steps on its own half-batch's
    gradient (the ranks' models drift apart, each unlike the one-process training)."""
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def fully_shard_with_local_float8_amax(module: torch.nn.Module, **kwargs: Any) -> Any:
    """FSDP2's fully_shard in a torchao whose float8 all-gather casts each rank's shard with the
    shard's own amax (``reduce_amax=False``: the all-reduce of amax forgotten), while the gathered
    weight is decoded with one rank's scale: what the promise of identical numerics guards.
    Harness-free: the all-gather check's script names it."""
    import importlib
    import warnings

    from torch.distributed.fsdp import fully_shard

    with warnings.catch_warnings():  # torchao's CUDA-only extensions do not load on a CPU host
        warnings.simplefilter("ignore")
        fsdp_utils: Any = importlib.import_module("torchao.float8.fsdp_utils")
    if not getattr(fsdp_utils, "_amp_local_amax", False):
        original = fsdp_utils.hp_tensor_to_float8_dynamic

        def local_amax(*args: Any, **kw: Any) -> Any:
            kw["reduce_amax"] = False
            return original(*args, **kw)

        fsdp_utils.hp_tensor_to_float8_dynamic = local_amax
        fsdp_utils._amp_local_amax = True
    return fully_shard(module, **kwargs)


def no_sync_always(ddp: Any, micro: int, micro_batches: int) -> Any:
    """Accumulation that keeps ``no_sync()`` for the last micro-batch too: the ranks never
    all-reduce, each steps on its own gradients."""
    return ddp.no_sync()


def no_sync_never_ending(original: str) -> str:
    """``harness.domains.patterns.rank_programs.NO_SYNC`` pointing at :func:`no_sync_always`."""
    return f"{__name__}:no_sync_always"


def checkpoint_recomputing_in_fp32(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose recomputation runs with autocast disabled."""
    import torch.utils.checkpoint

    from faults.patterns import recompute_outside_autocast

    return recompute_outside_autocast(torch.utils.checkpoint.checkpoint)(function, *args, **kwargs)


def checkpoint_in_fp32(original: str) -> str:
    """``harness.domains.patterns.rank_programs.CHECKPOINT`` pointing at :func:`checkpoint_recomputing_in_fp32`."""
    return f"{__name__}:checkpoint_recomputing_in_fp32"


def allreduce_corrupted_on_rank_1(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's fp32 all-reduce, except that rank 1 sends its bucket 1% too large (one rank's faulty
    reduction path: a bad NIC offload, a miscompiled kernel on one host)."""
    sent = bucket.buffer().div(dist.get_world_size())
    if dist.get_rank() == 1:
        sent.mul_(1.01)
    return _allreduce_into_bucket(bucket, sent)


def rank_1_dies(rank: int, world: int) -> None:
    """Rank 1's process exits mid-run (an OOM kill, a lost host); its peers wait in a collective."""
    import os

    if rank == 1:
        os._exit(3)
    dist.barrier()


def ranks_wait_to_be_killed(rank: int, world: int, pid_dir: str) -> None:
    """Every rank writes its process id where the test finds it, then keeps meeting its peers in
    barriers for a minute: the test kills one rank from outside (a lost host, an OOM kill) mid-run."""
    import os
    from pathlib import Path

    Path(pid_dir, f"rank{rank}.pid").write_text(str(os.getpid()), encoding="utf-8")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dist.barrier()
        time.sleep(0.05)


def checkpoint_recomputing_around_module_hooks(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose recomputation calls a module's ``forward`` itself,
    around its hooks: an FSDP2 unit's pre-forward hook, which casts the inputs to its policy's dtype,
    does not run (what torch 2.7 to 2.12 did in the recomputation: pytorch/pytorch#148831)."""
    import torch.utils.checkpoint

    calls = [0]

    def run(*inner: Any, **inner_kw: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1 and isinstance(function, torch.nn.Module):
            return function.forward(*inner, **inner_kw)
        return function(*inner, **inner_kw)

    return torch.utils.checkpoint.checkpoint(run, *args, **kwargs)


def checkpoint_around_module_hooks(original: str) -> str:
    """``harness.domains.patterns.rank_programs.CHECKPOINT`` pointing at :func:`checkpoint_recomputing_around_module_hooks`."""
    return f"{__name__}:checkpoint_recomputing_around_module_hooks"
