"""Mixed precision on torch.distributed: a rank launcher that cannot hang a test run, and the
rank programs of the distributed suite (DDP compression hooks, DDP + AMP parity, FSDP2 mixed
precision policies, sharded gradient scaling).

Ranks are fresh processes (forked from a forkserver that imported torch once; gloo on the CPU,
NCCL with 2+ GPUs) rendezvousing through a file
store in a fresh temporary directory, so parallel runs never compete for a port. Each rank writes
its result (or its traceback) to a file; the launcher joins with a timeout, kills stragglers, and
raises with the failing rank's traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import math
import tempfile
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.domains.engines.ranks import policy as P
from harness.domains.engines.ranks import world as W

#: Per-launch limit: starting 2 ranks takes well under a second once the forkserver has imported
#: torch (about 3 s the first time on 2 cores); a rank that has not
#: finished after this long is hung (deadlocked collective, crashed peer).
DEFAULT_TIMEOUT_S = 120.0


class RankError(RuntimeError):
    """A rank failed or hung; the message carries its traceback or the timeout."""


#: where releases before torch 2.6 keep FSDP2 (``fully_shard``, ``MixedPrecisionPolicy``): a spec
#: naming ``torch.distributed.fsdp`` is reached there on those releases
FSDP2_HOMES = {"torch.distributed.fsdp": "torch.distributed._composable.fsdp"}


def resolve(spec: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (importable in the spawned ranks); a name a
    release keeps elsewhere (FSDP2 before torch 2.6: :data:`FSDP2_HOMES`) is reached there."""
    module, _, name = spec.partition(":")
    found = getattr(importlib.import_module(module), name, None)
    if found is None and module in FSDP2_HOMES:
        found = getattr(importlib.import_module(FSDP2_HOMES[module]), name, None)
    if found is None:
        raise AttributeError(f"{spec}: torch {torch.__version__} has no {name} in {module}")
    assert callable(found)
    return found  # type: ignore[no-any-return]


@functools.cache
def fsdp2_missing() -> str | None:
    """Why this torch cannot run FSDP2 on the CPU (None where it can): a one-rank gloo world shards
    a Linear with ``fully_shard`` and runs it, in this process (milliseconds). torch 2.4's FSDP2
    creates CUDA streams in its first forward, so it runs on CUDA only."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        fully_shard = resolve(FULLY_SHARD)
    except (ImportError, AttributeError) as e:
        return f"torch {torch.__version__} has no FSDP2 ({FULLY_SHARD}): {e}"
    created = single_rank_group()
    try:
        m = torch.nn.Linear(2, 2)
        fully_shard(m, mesh=init_device_mesh("cpu", (1,)))
        m(torch.ones(1, 2))
    except Exception as e:  # whatever the release raises: the feature is not there on the CPU
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"torch {torch.__version__}'s FSDP2 (fully_shard) does not run on the CPU: {type(e).__name__}: {first}"
    finally:
        if created:
            dist.destroy_process_group()
    return None


def single_rank_group() -> bool:
    """Give this process a one-rank gloo group (an in-memory store) if it has no process group,
    for code that all-reduces even unsharded (ShardedGradScaler). True when this call created it:
    the caller destroys it (``torch.distributed.destroy_process_group()``)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    return True


def _entry(rank: int, world: int, spec: str, kwargs: dict[str, Any], workdir: str, backend: str) -> None:
    out = Path(workdir) / f"rank{rank}.json"
    try:
        warnings.simplefilter("ignore")  # rank chatter is not the result; errors are
        import torch.distributed as dist

        dist.init_process_group(backend, init_method=f"file://{workdir}/store", rank=rank, world_size=world)
        try:
            result = resolve(spec)(rank=rank, world=world, **kwargs)
        finally:
            dist.destroy_process_group()
        out.write_text(json.dumps({"ok": True, "result": result}), encoding="utf-8")
    except BaseException:
        out.write_text(json.dumps({"ok": False, "traceback": traceback.format_exc()}), encoding="utf-8")
        raise SystemExit(1) from None


def launch(
    spec: str, world: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None, **kwargs: Any
) -> list[Any]:
    """Run ``spec(rank=, world=, **kwargs)`` on ``world`` ranks; their return values, by rank.
    Under a launcher (:mod:`harness.domains.engines.ranks.world`) it runs on the launched world
    instead, whatever ``world`` asks: this process is one rank of it, and every rank gets every
    rank's result, so each judges the same results and every rank reaches the same verdict."""
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

    launched = W.launched()
    if launched is not None:
        return _on_launched_world(spec, launched, timeout_s, kwargs)

    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    with tempfile.TemporaryDirectory(prefix="amp-dist-") as workdir:
        _preload_forkserver()
        ctx = start_processes(  # type: ignore[no-untyped-call]
            _entry, args=(world, spec, kwargs, workdir, backend), nprocs=world, join=False, start_method="forkserver"
        )
        deadline = _now() + timeout_s
        try:
            while not ctx.join(timeout=max(0.0, min(1.0, deadline - _now()))):
                if _now() >= deadline:
                    missing = [r for r in range(world) if not (Path(workdir) / f"rank{r}.json").exists()]
                    raise RankError(
                        f"{spec}: rank(s) {missing} did not finish within {timeout_s:.0f} s (hung collective or crashed peer)"
                    )
        except ProcessRaisedException as exc:  # pragma: no cover - _entry converts exceptions to exit codes
            raise RankError(str(exc)) from None
        except ProcessExitedException:
            pass
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        reports = {
            r: json.loads(f.read_text(encoding="utf-8"))
            for r in range(world)
            if (f := Path(workdir) / f"rank{r}.json").exists()
        }
        failed = {r: d["traceback"] for r, d in reports.items() if not d["ok"]}
        if failed:  # the rank that broke first; its peers were then killed waiting for it
            raise RankError("\n".join(f"{spec}: rank {r} failed:\n{tb}" for r, tb in sorted(failed.items())))
        missing = [r for r in range(world) if r not in reports]
        if missing:
            raise RankError(f"{spec}: rank(s) {missing} exited without a result (killed or crashed before reporting)")
        return [reports[r]["result"] for r in range(world)]


def _on_launched_world(spec: str, launched: W.LaunchedWorld, timeout_s: float, kwargs: dict[str, Any]) -> list[Any]:
    """``spec`` on this rank of the launched world, every rank's outcome gathered to every rank
    (as JSON, as spawned ranks report theirs); a failure on any rank fails the launch on all,
    naming the rank.

    A rank that dies or hangs cannot leave its peers waiting: each rank marks its arrival in the
    launcher's store after its program, and waits for its peers' marks until ``timeout_s`` from
    the start; one missing then ends this rank's process, naming the missing ranks (the world is
    broken: every later check would wait on the same peer). A hung rank's own watchdog ends it a
    little later, its stack in the launcher's failure summary."""
    import torch.distributed as dist

    W.join(launched, timeout_s)
    launch_id = W.next_launch_id()
    start = _now()
    with W.watchdog(launched, spec, timeout_s):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # rank chatter is not the result; errors are (as in _entry)
                result = resolve(spec)(rank=launched.rank, world=launched.world_size, **kwargs)
            mine: dict[str, Any] = {"ok": True, "result": result}
        except Exception:
            mine = {"ok": False, "traceback": traceback.format_exc()}
        missing = W.await_peers(launched, launch_id, start + timeout_s)
        if missing:
            W.abandon_world(
                f"{spec}: rank(s) {missing} of the launched world did not finish within {timeout_s:.0f} s "
                f"(dead or hung); rank {launched.rank} ends its process: the world is broken"
            )
        gathered: list[Any] = [None] * launched.world_size
        dist.all_gather_object(gathered, json.dumps(mine))
    reports = [json.loads(g) for g in gathered]
    failed = {r: d["traceback"] for r, d in enumerate(reports) if not d["ok"]}
    if failed:
        raise RankError(
            "\n".join(f"{spec}: rank {r} of the launched world failed:\n{tb}" for r, tb in sorted(failed.items()))
        )
    return [d["result"] for d in reports]


#: What the forkserver imports once for every rank. Beyond torch: what DDP and FSDP import on first
#: use (torch._dynamo, and sympy through it: about 830 modules, 2 s per launch on 2 cores when every
#: forked rank imported them again).
FORKSERVER_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "torch.nn.parallel",
    "torch.distributed.fsdp",
    "torch.distributed.algorithms.ddp_comm_hooks",
    __name__,
]


def _preload_forkserver() -> None:
    """Ranks are forked from a server process that imported torch once (multiprocessing's
    forkserver, started at the first launch and reused): a fresh interpreter importing torch for
    every rank of every launch was most of the distributed suite's time. The server is a clean
    process (nothing but the imports: no threads, no CUDA), so forking from it is safe where
    forking the test process would not be."""
    import multiprocessing

    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)


def _now() -> float:
    import time

    return time.monotonic()


def _device(rank: int) -> torch.device:
    import torch.distributed as dist

    if dist.get_backend() != "nccl":
        return torch.device("cpu")
    launched = W.launched()  # under a launcher, ranks of several hosts: the GPU is the local rank's
    return torch.device("cuda", launched.local_rank if launched is not None else rank)


def device_mesh(rank: int, world: int) -> Any:
    """The ranks' one-dimensional mesh on this rank's device, for ``fully_shard(mesh=...)``:
    FSDP2's default mesh is on CUDA whenever CUDA is available, which puts gloo ranks' parameters
    on cuda:0 of a one-GPU host while their batches stay on the CPU."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(_device(rank).type, (world,))


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def _batch(rank: int, step: int = 0, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def _grads(model: torch.nn.Module) -> list[list[float]]:
    return [p.grad.detach().float().cpu().flatten().tolist() for p in model.parameters() if p.grad is not None]


# -- rank programs ------------------------------------------------------------------------------------
#: torch's own DDP communication hooks (``module:function`` names for the ranks to import)
DEFAULT_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"


def ddp_gradients(rank: int, world: int, hook: str, plain_hook: str | None = None) -> dict[str, Any]:
    """One backward of DDP with plain fp32 all-reduce and one with a compression hook
    (``module:function``): both averaged gradients, this rank's local gradients, and the dtypes
    each run's Python-level collectives carried (DDP's own all-reduce runs in C++: none seen).
    ``plain_hook``: the communication path of the "plain" run (None: DDP's own all-reduce; the
    harness's negative controls put a lossy one there)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device(rank)
    local = _model().to(dev)
    x, y = _batch(rank)
    torch.nn.functional.mse_loss(local(x.to(dev)), y.to(dev)).backward()  # type: ignore[no-untyped-call]
    out: dict[str, Any] = {"local": _grads(local)}
    for name, h in (("plain", plain_hook), ("hooked", hook)):
        ddp = DDP(_model().to(dev), device_ids=[rank] if dev.type == "cuda" else None)
        if h is not None:
            ddp.register_comm_hook(None, resolve(h))
        observed = P.Observed()
        with P.observe_collectives(observed):
            torch.nn.functional.mse_loss(ddp(x.to(dev)), y.to(dev)).backward()  # type: ignore[no-untyped-call]
        out[name] = _grads(ddp.module)
        out[f"{name}_observed"] = observed.as_dict()
    return out


def ddp_amp_training(rank: int, world: int, steps: int, hook: str | None = None) -> dict[str, Any]:
    """DDP + fp16 autocast + GradScaler, each rank on its half of every batch: the global losses
    and the first step's unscaled gradients (:func:`_amp_loop`). ``hook``: DDP's communication
    hook (``module:function``; None: its own all-reduce)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _device(rank)
    model = DDP(_model().to(dev), device_ids=[rank] if dev.type == "cuda" else None)
    if hook is not None:
        model.register_comm_hook(None, resolve(hook))
    return _amp_loop(model, dev, steps, lambda s: _shard(_global_batch(s), rank, world), lambda v: _mean_all(v, dist))


#: Samples per step of the data-parallel training (each of WORLD ranks gets an equal share).
GLOBAL_BATCH = 16


def _global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _batch(0, step, n=GLOBAL_BATCH)


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
    return _amp_loop(_model().to(dev), dev, steps, _global_batch, lambda v: v)


#: Modules of the distributed suite's model (:func:`_model`): three linears, two tanh
MODEL_MODULES = 5


def per_sample_gradient_magnitudes(step: int = 0) -> list[torch.Tensor]:
    """sum_i |g_i| per parameter element, in float64: g_i the contribution of sample i of the
    global batch at ``step`` to the gradient of the batch's mean loss (1/B of its own gradient),
    at the initial weights; what the budget of a reordered batch reduction is a multiple of."""
    model = _model().double()
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


#: FSDP2's sharding function (``module:function``): what the ranks wrap the model with.
FULLY_SHARD = "torch.distributed.fsdp:fully_shard"


def fsdp2_gradients(rank: int, world: int, reduce_dtype: str, shard: str = FULLY_SHARD) -> dict[str, Any]:
    """One forward and backward of FSDP2 (``shard``, each Linear and the root) under the policy
    param_dtype=bf16, the given reduce dtype, cast_forward_inputs=True (and output_dtype=fp32 on
    the root): the full
    averaged gradients, this rank's gradients of the same bf16 computation unsharded, and what the
    collectives carried and the modules computed in (:mod:`harness.domains.engines.ranks.policy`)."""
    MixedPrecisionPolicy = resolve("torch.distributed.fsdp:MixedPrecisionPolicy")
    fully_shard = resolve(shard)
    dev = _device(rank)
    x, y = _batch(rank)
    local = _model().to(dev).to(torch.bfloat16)
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
    model = _model().to(dev)
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
    return {"averaged": full, "local": _grads(local), "declared": declared, "observed": observed.as_dict()}


def sharded_scaler_step(rank: int, world: int, scaler: str, inf_ranks: list[int]) -> list[dict[str, Any]]:
    """FSDP2 + fp16 autocast: for each rank of ``inf_ranks`` in turn, an inf planted in that
    rank's gradient shard only (a fresh model and scaler per case, one process group: launching
    ranks is the cost). Every rank must skip the step and keep an identical scale."""
    fully_shard = resolve(FULLY_SHARD)
    dev = _device(rank)
    out = []
    for inf_rank in inf_ranks:
        model = _model().to(dev)
        fully_shard(model, mesh=device_mesh(rank, world))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        s = resolve(scaler)(dev.type)
        x, y = _batch(rank)
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

    dev = _device(rank)
    context = resolve(sync)
    scale = 2.0**10
    out = []
    for case in cases:
        plain = _model().to(dev)
        batches = []
        for i in range(micro_batches):
            x, y = _batch(rank, step=i, n=4)
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
        ddp = DDP(_model().to(dev))
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
    """FSDP2 (each Linear a unit, then the root) under ``dtype`` autocast, once with every hidden
    Linear + Tanh pair checkpointed through ``checkpoint`` (non-reentrant, as FSDP2 recipes do) and
    once without: this rank's shards of the averaged gradients of each, flattened, or what the
    checkpointed backward raised."""
    fully_shard = resolve(FULLY_SHARD)
    ckpt = resolve(checkpoint)
    dev = _device(rank)
    out: dict[str, Any] = {"device": str(dev)}
    for name, checkpointed in (("checkpointed", True), ("plain", False)):
        model = _model().to(dev)
        assert isinstance(model, torch.nn.Sequential)
        mesh = device_mesh(rank, world)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        x, y = _batch(rank)
        x, y = x.to(dev).requires_grad_(True), y.to(dev)
        try:
            with torch.autocast(dev.type, dtype=getattr(torch, dtype)):
                h = x
                layers = list(model)
                for i in range(0, len(layers) - 1, 2):  # (Linear, Tanh) pairs, then the head
                    pair = torch.nn.Sequential(layers[i], layers[i + 1])
                    h = ckpt(pair, h, use_reentrant=False) if checkpointed else pair(h)
                result = layers[-1](h)
            torch.nn.functional.mse_loss(result.float(), y).backward()  # type: ignore[no-untyped-call]
        except RuntimeError as exc:  # a recompute that fails its metadata check: the observation
            out[name] = {"raised": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
            continue
        out[name] = {"grads": [p.grad._local_tensor.float().flatten().tolist() for p in model.parameters()]}  # type: ignore[union-attr]
    return out


#: the all-reduce the bandwidth metric times, per rank: a buffer large enough that the per-call
#: latency is a small share on loopback gloo (CPU) and on NVLink (GPU); the row carries its size,
#: so that rows compare like with like
BANDWIDTH_BYTES = {"cpu": 4 << 20, "cuda": 256 << 20}
#: timed all-reduces per dtype, after one untimed (which also asks whether the backend has the dtype)
BANDWIDTH_REPEATS = 15


def _host() -> str:
    import socket

    return socket.gethostname()


def allreduce_bandwidth(
    rank: int, world: int, dtypes: list[str], all_reduce: str = "torch.distributed:all_reduce"
) -> dict[str, Any]:
    """Seconds per all-reduce (sum) of ``BANDWIDTH_BYTES`` on this rank, per dtype, each timed
    from a synchronised start to a synchronised end; a dtype the backend lacks gives its error.
    ``all_reduce``: the collective timed, by name (the harness's tests time a slowed one)."""
    import time

    import torch.distributed as dist

    reduce = resolve(all_reduce)

    device = _device(rank)
    nbytes = BANDWIDTH_BYTES[device.type]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    out: dict[str, Any] = {"nbytes": nbytes, "backend": str(dist.get_backend()), "host": _host(), "dtypes": {}}
    for name in dtypes:
        dtype = getattr(torch, name)
        x = torch.ones(nbytes // dtype.itemsize, dtype=dtype, device=device)
        try:
            reduce(x)
        except RuntimeError as exc:  # the same on every rank: the backend's dtype support
            out["dtypes"][name] = {"error": str(exc).strip().splitlines()[0][:200]}
            continue
        seconds = []
        for _ in range(BANDWIDTH_REPEATS):
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            reduce(x)
            sync()
            seconds.append(time.perf_counter() - t0)
        out["dtypes"][name] = {"seconds": seconds}
    return out
