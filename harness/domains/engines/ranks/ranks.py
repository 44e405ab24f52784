"""A rank launcher that cannot hang a test run: ``launch(programs.ddp_gradients, world=2)`` runs a
family's rank program (``distributed/programs.py``, ``patterns/rank_programs.py``, ...) on fresh
ranks, or on the launched world. Ranks are fresh processes (forked from a forkserver that imported
torch once; gloo on the CPU, NCCL with 2+ GPUs) rendezvousing through a file store in a fresh
temporary directory, so parallel runs never compete for a port. Each rank writes its result (or its
traceback) to a file; the launcher joins with a timeout, kills stragglers, and raises with the
failing rank's traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from harness.domains.engines.ranks import world as W
from harness.platform import compat

#: Per-launch limit: starting 2 ranks takes well under a second once the forkserver has imported
#: torch (about 3 s the first time on 2 cores); a rank that has not
#: finished after this long is hung (deadlocked collective, crashed peer).
DEFAULT_TIMEOUT_S = 120.0
#: Once every rank has written its result, the teardown's time before the ranks are ended (it takes
#: well under a second; gloo's on torch 2.4 to 2.6 could hang with two worlds at once, results on disk)
TEARDOWN_GRACE_S = 10.0


class RankError(RuntimeError):
    """A rank failed or hung; the message carries its traceback or the timeout."""


def resolve(spec: str) -> Callable[..., Any]:
    """``"package.module:function"`` -> the function (importable in the spawned ranks); a name a
    release keeps elsewhere (FSDP2 before torch 2.6: ``compat.FSDP2_HOMES``) is reached there."""
    module, _, name = spec.partition(":")
    found = getattr(importlib.import_module(module), name, None)
    if found is None and module in compat.FSDP2_HOMES:
        found = getattr(importlib.import_module(compat.FSDP2_HOMES[module]), name, None)
    if found is None:
        raise AttributeError(f"{spec}: torch {torch.__version__} has no {name} in {module}")
    assert callable(found)
    return found  # type: ignore[no-any-return]


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
        _report(out, {"ok": True, "result": resolve(spec)(rank=rank, world=world, **kwargs)})
    except BaseException:  # its peers, waiting on it, are ended by the launcher
        _report(out, {"ok": False, "traceback": traceback.format_exc()})
        raise SystemExit(1) from None
    dist.barrier()  # every rank done with its collectives before the teardown (the result is on disk)
    dist.destroy_process_group()


def _report(out: Path, report: dict[str, Any]) -> None:
    """Written whole or not at all: the launcher may end a rank at any moment, mid-write too."""
    out.with_suffix(".tmp").write_text(json.dumps(report), encoding="utf-8")
    os.replace(out.with_suffix(".tmp"), out)


def launch(
    program: str | Callable[..., Any],
    world: int = 2,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    backend: str | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Run ``program(rank=, world=, **kwargs)`` on ``world`` ranks (a module-level function, or its
    ``"module:function"`` name); their return values, by rank.
    Under a launcher (:mod:`harness.domains.engines.ranks.world`) it runs on the launched world
    instead, whatever ``world`` asks: this process is one rank of it, and every rank gets every
    rank's result, so each judges the same results and every rank reaches the same verdict."""
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, start_processes

    spec = program if isinstance(program, str) else f"{program.__module__}:{program.__qualname__}"
    launched = W.launched()
    if launched is not None:
        return _on_launched_world(spec, launched, timeout_s, kwargs)

    backend = backend or ("nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo")
    with tempfile.TemporaryDirectory(prefix="amp-dist-") as workdir:
        _preload_forkserver()
        ctx = start_processes(  # type: ignore[no-untyped-call]
            _entry, args=(world, spec, kwargs, workdir, backend), nprocs=world, join=False, start_method="forkserver"
        )
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.0, min(1.0, deadline - time.monotonic()))):
                missing = [r for r in range(world) if not (Path(workdir) / f"rank{r}.json").exists()]
                if not missing:  # only the teardown is left: its grace, then the kill below
                    deadline = min(deadline, time.monotonic() + TEARDOWN_GRACE_S)
                if time.monotonic() >= deadline:
                    if not missing:
                        break
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
    start = time.monotonic()
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


def rank_device(rank: int) -> torch.device:
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

    return init_device_mesh(rank_device(rank).type, (world,))
