"""The world a launcher started (torchrun, Slurm's srun, a Kubernetes job running torchrun): when the
suites run under one, the distributed checks run on that world instead of spawning ranks of their
own, and the run's rows are gathered to rank 0, which alone writes the run report.

A launcher is recognised by torch.distributed's environment: ``RANK`` and ``WORLD_SIZE`` (with
``LOCAL_RANK``, and ``MASTER_ADDR``/``MASTER_PORT`` or a rendezvous torchrun resolved into them),
``WORLD_SIZE`` above 1. The process group is joined once per session (NCCL where this rank has a
GPU of its own, gloo otherwise), with a collective timeout: a rank that dies or hangs ends every
peer's collective within it, and torchrun's agent ends the job naming the rank that failed."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

#: how long a collective on the launched world waits for a peer before it fails
COLLECTIVE_TIMEOUT_S = 120.0
#: how much longer than its peers a hung rank waits before its watchdog ends it: its peers, which
#: can name it, report first
HUNG_RANK_GRACE_S = 10.0
#: the exit status of a rank that ends because a peer never arrived (torchrun prints it)
BROKEN_WORLD_EXIT = 75
#: how often a rank waiting for its peers looks for their arrival marks
_POLL_S = 0.05

_launches = 0


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


def next_launch_id() -> int:
    """The number of this launch in the session. Every rank launches the same checks in the same
    order, so the same launch has the same number on every rank."""
    global _launches
    _launches += 1
    return _launches


def await_peers(world: LaunchedWorld, launch_id: int, deadline: float) -> list[int]:
    """Mark this rank's arrival at the end of launch ``launch_id`` in the launcher's store, and
    wait for every peer's until ``deadline`` (``time.monotonic()``); the ranks still missing then."""
    import time

    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    key = f"amp-harness/launch{launch_id}/arrived"
    store.set(f"{key}/{world.rank}", "1")
    waiting = [r for r in range(world.world_size) if r != world.rank]
    while waiting:
        waiting = [r for r in waiting if not store.check([f"{key}/{r}"])]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    return waiting


@contextmanager
def watchdog(world: LaunchedWorld, what: str, timeout_s: float) -> Iterator[None]:
    """End this rank if the block has not finished ``HUNG_RANK_GRACE_S`` after ``timeout_s`` (its
    peers, waiting ``timeout_s``, name it first where any is left): a thread that reports the
    block's stack through :func:`abandon_world`, and faulthandler's dump and exit later still, for
    a hang that holds the interpreter."""
    import faulthandler
    import sys
    import traceback

    seconds = timeout_s + HUNG_RANK_GRACE_S
    done, blocked = threading.Event(), threading.get_ident()

    def fire() -> None:
        if done.wait(seconds):
            return
        frame = sys._current_frames().get(blocked)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
        abandon_world(
            f"{what}: rank {world.rank} of the launched world did not finish within {seconds:.0f} s "
            f"(hung); where it was:\n{stack}"
        )

    threading.Thread(target=fire, daemon=True, name="amp-harness-watchdog").start()
    faulthandler.dump_traceback_later(seconds + HUNG_RANK_GRACE_S, exit=True)
    try:
        yield
    finally:
        done.set()
        faulthandler.cancel_dump_traceback_later()


class BrokenWorld(RuntimeError):
    """A peer of the launched world never arrived: this rank ends its process."""


def abandon_world(why: str) -> None:
    """End this rank's process at once, saying why: a peer is gone, so every collective left in
    the session would wait on it. The reason goes to the launcher's error file (torchrun prints it
    in its failure summary, naming this rank; pytest holds this process's stderr) and to stderr."""
    import sys

    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    try:
        raise BrokenWorld(why)
    except BrokenWorld as exc:  # raised for its traceback in the error file
        with contextlib.suppress(OSError):  # the error file is a courtesy: stderr and the exit status remain
            ErrorHandler().record_exception(exc)
    print(f"amp-harness: {why}", file=sys.stderr, flush=True)
    os._exit(BROKEN_WORLD_EXIT)
