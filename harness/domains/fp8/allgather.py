"""float8 all-gather under FSDP2: the same training with and without it.

torchao's ``enable_fsdp_float8_all_gather`` casts each sharded weight to float8 before FSDP2
gathers it (half the bytes of bf16 on the wire), with the scale of the *whole* weight (its amax
all-reduced across ranks), so the gathered float8 weight is the one the forward would have cast
itself: training is promised to be numerically identical. A rank program here trains a small
float8 MLP under FSDP2 (gloo on the CPU, NCCL on GPUs) and returns its losses and final weights,
so that a run with the all-gather can be compared with one without, bit for bit.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.domains.engines.ranks.ranks import device_mesh, resolve
from harness.platform.compat import FULLY_SHARD
from harness.platform.thirdparty import import_third_party

#: global batch, features: every rank's shard of every weight is whole rows, the batch splits evenly
BATCH, WIDTH, HIDDEN = 32, 32, 64


def _step_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, WIDTH, generator=gen), torch.randn(BATCH, WIDTH, generator=gen)


def _train(rank: int, world: int, all_gather: bool, steps: int, emulate: bool, shard: str) -> dict[str, Any]:
    import torch.distributed as dist

    float8 = import_third_party("torchao.float8")
    fully_shard = resolve(shard)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    )  # fmt: skip
    config = float8.Float8LinearConfig(emulate=emulate, enable_fsdp_float8_all_gather=all_gather)
    float8.convert_to_float8_training(model, config=config)
    mesh = device_mesh(rank, world)
    for layer in model:
        if type(layer).__name__ == "Float8Linear":
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        x, y = _step_batch(step)
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)
    shards = []
    for p in model.parameters():
        local = p.to_local().detach()  # type: ignore[attr-defined]  # a DTensor
        local = getattr(local, "_tensor", local)  # float8 all-gather wraps the weight's shard
        shards.append(local.float().flatten().tolist())
    return {"losses": losses, "shards": shards}


def float8_fsdp2_training(
    rank: int, world: int, steps: int, emulate: bool, shard: str = FULLY_SHARD
) -> dict[str, dict[str, Any]]:
    """``steps`` SGD steps of a float8 (tensorwise) MLP sharded by ``shard`` over ``world`` ranks,
    without and then with float8 all-gather (one launch): for each, the global mean loss of every
    step and this rank's shards of the final weights."""
    return {key: _train(rank, world, key == "all_gather", steps, emulate, shard) for key in ("plain", "all_gather")}
