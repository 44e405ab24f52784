"""The AMP patterns on data-parallel ranks, standalone: WORLD ranks forked from this process over
gloo on the CPU, each running the patterns suite's rank program on its model and batches:

- no_sync: DDP + fp16 autocast + GradScaler accumulating MICRO_BATCHES micro-batches under
  ``no_sync()`` but the last; clean, every rank holds one scale and the same synchronised gradient,
  within gamma_(k+world-2)(2^-24) of the float64 average of the ranks' sums of their micro-batches'
  own gradients; with an inf in one rank's micro-batch (INF_AT), every rank skips and halves;
- fsdp2_checkpoint: FSDP2 over every Linear with the hidden Linear + Tanh pairs checkpointed
  (non-reentrant) under DTYPE autocast: every rank's gradient shards bit for bit those without.
- fsdp2_policy_checkpoint: FSDP2 units under MixedPrecisionPolicy(param_dtype=DTYPE), each given an
  fp32 table by its parent and checkpointed (non-reentrant): shards bit for bit those without.

amp-harness writes a failed check's values over the defaults below and keeps the program and the
judgement it failed (``harness.domains.patterns.repro``). As it lies two ranks run the clean DDP
accumulation (the last program and judgement defined).
"""

import contextlib
import importlib
import math
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


def model() -> torch.nn.Sequential:  # the ranks' model (seed 0)
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def batch(rank: int, step: int = 0, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:  # as the suite draws them
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


# -- fsdp2_checkpoint --
SHARD = "torch.distributed.fsdp:fully_shard"  # the sharding under test
CHECKPOINT = "torch.utils.checkpoint:checkpoint"  # the checkpoint function under test
DTYPE = torch.bfloat16  # the autocast dtype


def rank_program(rank: int) -> Any:
    """This rank's gradient shards with and without the blocks checkpointed, or what raised."""
    from torch.distributed.device_mesh import init_device_mesh

    out: dict[str, Any] = {}
    for name, checkpointed in (("checkpointed", True), ("plain", False)):
        m = model()
        mesh = init_device_mesh("cpu", (WORLD,))
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                resolve(SHARD)(layer, mesh=mesh)
        resolve(SHARD)(m, mesh=mesh)
        x, y = batch(rank)
        x = x.requires_grad_(True)
        try:
            with torch.autocast("cpu", dtype=DTYPE):
                h, layers = x, list(m)
                for i in range(0, len(layers) - 1, 2):  # (Linear, Tanh) pairs, then the head
                    pair = torch.nn.Sequential(layers[i], layers[i + 1])
                    h = resolve(CHECKPOINT)(pair, h, use_reentrant=False) if checkpointed else pair(h)
                result = layers[-1](h)
            torch.autograd.backward(F.mse_loss(result.float(), y))
        except RuntimeError as exc:
            out[name] = f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
            continue
        out[name] = [p.grad.to_local().float().flatten() for p in m.parameters()]  # type: ignore[union-attr]
    return out


# -- fsdp2_policy_checkpoint --
POLICY = "torch.distributed.fsdp:MixedPrecisionPolicy"  # the FSDP2 mixed-precision policy


class TableBlock(torch.nn.Module):  # a layer given an fp32 table by its parent (rotary embeddings)
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(h) * table)


class TableNet(torch.nn.Module):  # three such blocks, each checkpointed (non-reentrant) or not, then a head
    def __init__(self, checkpointed: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.checkpointed = checkpointed
        self.blocks = torch.nn.ModuleList([TableBlock() for _ in range(3)])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        table = torch.cos(torch.arange(16, dtype=torch.float32) / 16)
        for block in self.blocks:
            h = resolve(CHECKPOINT)(block, h, table, use_reentrant=False) if self.checkpointed else block(h, table)
        out: torch.Tensor = self.head(h)
        return out


def rank_program(rank: int) -> Any:  # type: ignore[no-redef]  # noqa: F811
    """This rank's gradient shards with and without the units checkpointed under the policy, or what raised."""
    from torch.distributed.device_mesh import init_device_mesh

    out: dict[str, Any] = {}
    for name, checkpointed in (("checkpointed", True), ("plain", False)):
        net = TableNet(checkpointed)
        mesh = init_device_mesh("cpu", (WORLD,))
        policy = resolve(POLICY)(param_dtype=DTYPE, reduce_dtype=torch.float32)
        for block in net.blocks:
            resolve(SHARD)(block, mesh=mesh, mp_policy=policy)
        resolve(SHARD)(net, mesh=mesh, mp_policy=policy)
        x, y = batch(rank)
        try:
            torch.autograd.backward(F.mse_loss(net(x).float(), y[:, :1]))
        except RuntimeError as exc:
            out[name] = f"raised {type(exc).__name__}: {str(exc).splitlines()[0]}"
            continue
        out[name] = [p.grad.to_local().float().flatten() for p in net.parameters()]  # type: ignore[union-attr]
    return out


# -- no_sync --
MICRO_BATCHES = 4  # micro-batches per effective batch
INF_AT: list[int] | None = None  # [rank, micro-batch] whose input holds an inf (None: clean)


def rank_program(rank: int) -> Any:  # type: ignore[no-redef]  # noqa: F811
    """This rank's scales, unscaled gradients, own float64 sums, and whether the step moved."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    scale = 2.0**10
    plain = model()
    batches = []
    for i in range(MICRO_BATCHES):
        x, y = batch(rank, step=i, n=4)
        if [rank, i] == INF_AT:
            x[0, 0] = math.inf
        batches.append((x, y))
    own = []
    for x, y in batches:  # the reference: each micro-batch's gradient from its own backward, unscaled
        plain.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(plain(x).float(), y) / MICRO_BATCHES
        torch.autograd.backward(loss * scale)
        own.append(
            torch.cat([p.grad.detach().double().flatten() for p in plain.parameters() if p.grad is not None]) / scale
        )
    stacked = torch.stack(own)
    ddp = DDP(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale, growth_interval=1000)
    scales = []
    for i, (x, y) in enumerate(batches):
        with ddp.no_sync() if i < MICRO_BATCHES - 1 else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.mse_loss(ddp(x).float(), y) / MICRO_BATCHES
            torch.autograd.backward(scaler.scale(loss))
        scales.append(float(scaler.get_scale()))
    scaler.unscale_(opt)
    grads = torch.cat([p.grad.detach().double().flatten() for p in ddp.parameters() if p.grad is not None])
    before = [p.detach().clone() for p in ddp.parameters()]
    scaler.step(opt)
    scaler.update()
    stepped = any(not torch.equal(b, p) for b, p in zip(before, ddp.parameters(), strict=True)) or bool(opt.state)
    return {
        "scales": torch.tensor(scales),
        "scale_after": torch.tensor(float(scaler.get_scale())),
        "grads": grads,
        "own_sum": stacked.sum(0),
        "own_abs_sum": stacked.abs().sum(0),
        "stepped": torch.tensor(stepped),
    }


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

# -- fsdp2_same --


def judge() -> Verdict:
    """Every rank's gradient shards with the blocks checkpointed bit for bit those without."""
    problems = []
    for i, r in enumerate(ranks):
        if isinstance(r["checkpointed"], str):
            problems.append(f"rank {i}: the checkpointed backward {r['checkpointed']}")
        elif not all(torch.equal(a, b) for a, b in zip(r["checkpointed"], r["plain"], strict=True)):
            problems.append(f"rank {i}: gradient shards differ from the model without checkpointing")
    print(f"FSDP2 checkpointing under {DTYPE}: " + ("; ".join(problems) or "every shard bit for bit"))
    return len(problems), 0  # promises broken


# -- no_sync_skip --


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    """An inf in one rank's micro-batch: every rank skips and halves its scale once."""
    problems = [f"rank {i} stepped" for i, r in enumerate(ranks) if bool(r["stepped"])]
    problems += [
        f"rank {i}: scale {float(r['scales'][0])} -> {float(r['scale_after'])}, expected x0.5"
        for i, r in enumerate(ranks)
        if float(r["scale_after"]) != float(r["scales"][0]) * 0.5
    ]
    print(f"inf at {INF_AT}: " + ("; ".join(problems) or "every rank skipped and halved"))
    return len(problems), 0  # promises broken


# -- no_sync_sum --


def judge() -> Verdict:  # type: ignore[no-redef]  # noqa: F811
    """One scale per effective batch, one synchronised gradient, within its float64 budget."""
    u = 2.0**-24  # float32's unit roundoff
    k = MICRO_BATCHES + WORLD - 2  # additions on each rank, then in the all-reduce (/WORLD is exact)
    reference = torch.stack([r["own_sum"] for r in ranks]).mean(0)
    budget = k * u / (1 - k * u) * torch.stack([r["own_abs_sum"] for r in ranks]).mean(0)
    problems = [
        f"rank {i}: scales {r['scales'].tolist()}" for i, r in enumerate(ranks) if len(set(r["scales"].tolist())) != 1
    ]
    problems += [
        f"rank {i}'s gradients differ from rank 0's"
        for i in range(1, WORLD)
        if not torch.equal(ranks[i]["grads"], ranks[0]["grads"])
    ]
    over = int(((ranks[0]["grads"] - reference).abs() > budget).sum())
    if over:
        problems.append(f"{over} of {reference.numel()} gradient elements over their budget")
    print("no_sync accumulation: " + ("; ".join(problems) or "one scale, one gradient, within budget"))
    return len(problems), 0  # promises broken


# -- verdict --
measured, allowed = judge()
