"""Fixtures of the distributed suite: the implementations under test, named as
``module:function`` so the spawned ranks can import them (the harness's own tests swap in
broken ones)."""

from __future__ import annotations

import pytest

_TORCH_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"


@pytest.fixture
def ddp_plain_hook() -> str | None:
    """DDP's uncompressed communication path: None is DDP's own fp32 all-reduce."""
    return None


@pytest.fixture
def ddp_amp_hook() -> str | None:
    """DDP's communication path in the AMP training check: None is DDP's own all-reduce."""
    return None


@pytest.fixture
def ddp_hook() -> dict[str, str]:
    """DDP gradient-compression hooks, by format."""
    return {"fp16": f"{_TORCH_HOOKS}:fp16_compress_hook", "bf16": f"{_TORCH_HOOKS}:bf16_compress_hook"}


def _fsdp2_here() -> None:
    """Skip, naming the release and the feature, where FSDP2 does not run on these ranks' devices
    (the CPU ranks of gloo; on two GPUs NCCL's ranks run it)."""
    import torch

    from harness.platform import compat

    if torch.cuda.device_count() < 2:
        why = compat.fsdp2_missing()
        if why is not None:
            pytest.skip(why)


@pytest.fixture
def sharded_scaler() -> str:
    """The gradient scaler of sharded (FSDP2) training."""
    _fsdp2_here()
    return "harness.domains.distributed.programs:sharded_grad_scaler"


@pytest.fixture
def fsdp2_shard() -> str:
    """FSDP2's sharding function, applied with the declared mixed-precision policy."""
    _fsdp2_here()
    return "torch.distributed.fsdp:fully_shard"
