"""The world a launcher started (torchrun, Slurm's srun, a Kubernetes job running torchrun): when the
suites run under one, the distributed checks run on that world instead of spawning ranks of their
own, and the run's rows are gathered to rank 0, which alone writes the run report.

A launcher is recognised by torch.distributed's environment: ``RANK`` and ``WORLD_SIZE`` (with
``LOCAL_RANK``, and ``MASTER_ADDR``/``MASTER_PORT`` or a rendezvous torchrun resolved into them),
``WORLD_SIZE`` above 1. The process group is joined once per session (NCCL where this rank has a
GPU of its own, gloo otherwise), with a collective timeout: a rank that dies or hangs ends every
peer's collective within it, and torchrun's agent ends the job naming the rank that failed."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

#: how long a collective on the launched world waits for a peer before it fails
COLLECTIVE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LaunchedWorld:
    rank: int
    world_size: int
    local_rank: int
    host: str

    @property
    def tags(self) -> dict[str, object]:
        """What every row this rank records carries: which rank, of which host."""
        return {"rank": self.rank, "local_rank": self.local_rank, "host": self.host, "world_size": self.world_size}


def launched() -> LaunchedWorld | None:
    """The launched world this process belongs to, or None (no launcher, or a world of one)."""
    env = os.environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        return None
    if size < 2:
        return None
    return LaunchedWorld(rank, size, local, socket.gethostname())


def backend(world: LaunchedWorld) -> str:
    """NCCL where this rank has a GPU of its own on its host, gloo otherwise."""
    import torch  # not at import: the pytest plugin asks whether a launcher started it, torch-free

    return "nccl" if torch.cuda.is_available() and world.local_rank < torch.cuda.device_count() else "gloo"


def join(world: LaunchedWorld, timeout_s: float = COLLECTIVE_TIMEOUT_S) -> None:
    """Join the launched world's process group (once: later calls find it joined)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    chosen = backend(world)
    if chosen == "nccl":
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(chosen, timeout=timedelta(seconds=timeout_s))
