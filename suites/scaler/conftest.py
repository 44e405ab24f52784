"""Fixtures of the loss-scaler suite: the scaler class under test, replaceable to prove the suite
can fail (the harness's own tests swap in deliberately broken scalers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


def _single_rank_group() -> bool:
    """ShardedGradScaler all-reduces its found-inf flags over a process group: give it one rank
    (gloo over an in-memory store). True when this call created the group."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return True


@pytest.fixture(params=["GradScaler", "ShardedGradScaler"])
def scaler_factory(request: pytest.FixtureRequest) -> Iterator[type[torch.amp.GradScaler]]:
    """The loss scaler the suite judges: ``torch.amp.GradScaler`` and FSDP's ``ShardedGradScaler``
    (in a single-rank process group, which it needs even unsharded)."""
    if request.param == "GradScaler":
        yield torch.amp.GradScaler
        return
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("ShardedGradScaler needs torch.distributed, which this torch build lacks")
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    created = _single_rank_group()
    try:
        yield ShardedGradScaler
    finally:
        if created:
            dist.destroy_process_group()
