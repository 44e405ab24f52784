"""float8 all-gather under FSDP2, standalone: two ranks forked from this process over gloo on the
CPU train torchao's float8 MLP (tensorwise scaling, emulated matmuls) sharded by FSDP2, once
without and once with float8 all-gather; torchao promises the same numerics both ways, so the
losses and the final weight shards must agree bit for bit.

amp-harness writes a failed check's values over the defaults below
(``harness.domains.fp8.repro.float8_all_gather``). As it lies here it runs torch's own
``fully_shard``.
"""

import importlib
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

# -- prelude --
WORLD = 2  # ranks, forked from this process (they see its torch as it is): gloo on the CPU


def resolve(spec: str) -> Callable[..., Any]:  # "module:function" -> the function
    module, _, name = spec.partition(":")
    found: Callable[..., Any] | None = getattr(importlib.import_module(module), name, None)
    if found is None and module == "torch.distributed.fsdp":  # before torch 2.6 FSDP2 lived here
        found = getattr(importlib.import_module("torch.distributed._composable.fsdp"), name)
    assert found is not None, spec
    return found


def cpu_mesh() -> Any:  # FSDP2's default mesh is on CUDA whenever CUDA is available; these ranks are gloo's
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


# -- float8_all_gather --
SHARD = "torch.distributed.fsdp:fully_shard"  # the sharding under test
STEPS = 4  # training steps
EMULATE = True  # emulated: no fp8 matmul kernel here
BATCH, WIDTH, HIDDEN = 32, 32, 64  # global batch, features: every weight shard is whole rows


def train(rank: int, all_gather: bool) -> dict[str, Any]:
    """The float8 MLP (torchao, tensorwise) sharded by SHARD, as the suite trains it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's CUDA-only extensions do not load on a CPU host
        from torchao import float8
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, HIDDEN),
        torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    )
    config = float8.Float8LinearConfig(emulate=EMULATE, enable_fsdp_float8_all_gather=all_gather)
    float8.convert_to_float8_training(m, config=config)
    for layer in m:
        if type(layer).__name__ == "Float8Linear":
            resolve(SHARD)(layer, mesh=cpu_mesh())
    resolve(SHARD)(m, mesh=cpu_mesh())
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
        loss = F.mse_loss(m(x.chunk(WORLD)[rank]), y.chunk(WORLD)[rank])
        opt.zero_grad()
        torch.autograd.backward(loss)
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    params: list[Any] = list(m.parameters())
    local = [p.to_local().detach() for p in params]
    shards = [getattr(t, "_tensor", t).float().flatten() for t in local]  # all-gather wraps a shard
    return {"losses": torch.tensor(losses, dtype=torch.float64), "shards": shards}


def rank_program(rank: int) -> Any:
    return {"plain": train(rank, False), "all_gather": train(rank, True)}  # without, then with float8 all-gather


# -- launch --


def _rank(rank: int, workdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=WORLD)
    try:
        torch.save(rank_program(rank), f"{workdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


with tempfile.TemporaryDirectory() as workdir:
    mp.start_processes(_rank, args=(workdir,), nprocs=WORLD, start_method="fork")  # type: ignore[attr-defined,no-untyped-call]
    ranks: list[Any] = [torch.load(f"{workdir}/rank{r}.pt", weights_only=True) for r in range(WORLD)]

Verdict = tuple[float, float]  # measured, allowed

# -- float8_all_gather_reference --


def judge() -> Verdict:
    """Reference: the same training without float8 all-gather, bit for bit (torchao promises it)."""
    wrong = 0
    for r, out in enumerate(ranks):
        plain, gathered = out["plain"], out["all_gather"]
        if not torch.equal(plain["losses"], gathered["losses"]):
            print(f"rank {r}: losses without {plain['losses'].tolist()}, with {gathered['losses'].tolist()}")
            wrong += 1
        for i, (a, b) in enumerate(zip(plain["shards"], gathered["shards"], strict=True)):
            if not torch.equal(a, b):
                print(f"rank {r}, parameter {i}: final shards differ by up to {float((a - b).abs().max())!r}")
                wrong += 1
    return wrong, 0  # losses and final weight shards unlike the run without it


# -- verdict --
measured, allowed = judge()
