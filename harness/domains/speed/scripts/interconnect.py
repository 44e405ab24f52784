"""The all-reduce's bus bandwidth, standalone: WORLD ranks forked from this process over gloo on
the CPU each time BANDWIDTH_BYTES of DTYPE all-reduced (sum), REPEATS times after one untimed
call, each from a synchronised start; the bus bandwidth is NCCL's tests' statistic, size / time x
2(n-1)/n from the slowest rank's median. It must hold the FLOOR the hardware class calibrated for
this world's shape (the calibrated median slowed sqrt(1.3) times), measured twice: a first
measurement under the floor is confirmed by a second.

amp-harness writes a failed check's dtype, size, world and floor over the defaults below
(``harness.domains.speed.repro``). As it lies it holds float32 to a floor of 0 GB/s.
"""

import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# -- parameters --
WORLD = 2  # ranks, forked from this process: gloo on the CPU
DTYPE = torch.float32  # the dtype all-reduced
BANDWIDTH_BYTES = 4 << 20  # bytes per rank: the per-call latency a small share on loopback
REPEATS = 15  # timed all-reduces after one untimed
FLOOR = 0.0  # GB/s: the floor the class calibrated for this shape

# -- measure --


def _rank(rank: int, workdir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=WORLD)
    try:
        x = torch.ones(BANDWIDTH_BYTES // DTYPE.itemsize, dtype=DTYPE)
        dist.all_reduce(x)
        seconds = []
        for _ in range(REPEATS):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            seconds.append(time.perf_counter() - t0)
        torch.save(torch.tensor(seconds, dtype=torch.float64), f"{workdir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def measure() -> float:
    """One launch's bus bandwidth in GB/s."""
    with tempfile.TemporaryDirectory() as workdir:
        mp.start_processes(_rank, args=(workdir,), nprocs=WORLD, start_method="fork")  # type: ignore[attr-defined,no-untyped-call]
        medians = [float(statistics.median(torch.load(f"{workdir}/rank{r}.pt").tolist())) for r in range(WORLD)]
    return BANDWIDTH_BYTES / max(medians) * 2 * (WORLD - 1) / WORLD / 1e9


# -- floor --
first = measure()
values = [first] if first >= FLOOR else [first, measure()]  # under the floor: confirmed by a second
print(f"{DTYPE} all-reduce bus bandwidth {', '.join(f'{v:.3g}' for v in values)} GB/s, floor {FLOOR:.3g} GB/s")
measured = -max(values)  # the better of the measurements, negated: a bandwidth must not fall under the floor
allowed = -FLOOR
