"""Fixtures of the loss-scaler suite: the scaler class under test, replaceable to prove the suite
can fail (the harness's own tests swap in deliberately broken scalers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from harness.domains.engines.ranks.ranks import single_rank_group


@pytest.fixture(params=["GradScaler", "ShardedGradScaler"])
def scaler_factory(request: pytest.FixtureRequest) -> Iterator[type[torch.amp.GradScaler]]:
    """The loss scaler the suite judges: ``torch.amp.GradScaler`` and FSDP's ``ShardedGradScaler``
    (in a single-rank gloo group, which it needs even unsharded)."""
    if request.param == "GradScaler":
        yield torch.amp.GradScaler
        return
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("ShardedGradScaler needs torch.distributed, which this torch build lacks")
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    created = single_rank_group()
    try:
        yield ShardedGradScaler
    finally:
        if created:
            dist.destroy_process_group()
