"""All-reduce bus bandwidth: measured on the ranks the distributed suite runs on, judged where the
hardware class has calibrated a floor for that world's shape (backend, ranks, hosts).

The statistic is NCCL's tests' bus bandwidth, size / time x 2(n-1)/n, from the slowest rank's
median all-reduce (a collective is as fast as its slowest rank). Its floor is placed as the speed
thresholds are (:func:`harness.domains.speed.thresholds.threshold_from_calibration`): between the
calibration runs' median and that median slowed ``DETECT_SLOWDOWN`` times, and only where the
runs scatter less than half that gap; otherwise the class records the figure and never judges it.
A value below the floor is measured again: only a second value below it fails (as the speed gate
confirms its failures); one above it makes the first NOISY."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.domains.engines.bench.bench import DETECT_SLOWDOWN
from harness.domains.speed.thresholds import Threshold, threshold_from_calibration
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.verdict import Outcome

#: the dtypes whose all-reduce bandwidth is measured: fp32 (DDP's default), the AMP formats
DTYPES = ("float32", "bfloat16", "float16")
#: the rank program that times the all-reduces (:func:`allreduce_bandwidth`, below)
RANK_PROGRAM = f"{__name__}:allreduce_bandwidth"


def case(backend: str, world: int, hosts: int) -> str:
    """The profile key of a world's shape: its floor holds only for the same backend, ranks and hosts."""
    return f"allreduce_bus_bandwidth_{backend}_{world}ranks_{hosts}hosts"


@dataclass(frozen=True)
class Measured:
    """One launch's bus bandwidth per dtype (GB/s; None: the backend lacks the dtype, ``errors`` says why)."""

    backend: str
    world: int
    hosts: int
    nbytes: int
    gbps: dict[str, float | None]
    errors: dict[str, str]
    median_s_per_rank: dict[str, list[float]]

    @property
    def case(self) -> str:
        return case(self.backend, self.world, self.hosts)


def from_ranks(results: list[dict[str, Any]]) -> Measured:
    """The bus bandwidth of the ranks' timings (``ranks.allreduce_bandwidth``'s results, by rank)."""
    world, nbytes, backend = len(results), int(results[0]["nbytes"]), str(results[0]["backend"])
    hosts = len({r.get("host", "") for r in results})
    gbps: dict[str, float | None] = {}
    errors: dict[str, str] = {}
    medians: dict[str, list[float]] = {}
    for name in results[0]["dtypes"]:
        first = results[0]["dtypes"][name]
        if "error" in first:
            gbps[name], errors[name] = None, str(first["error"])
            continue
        medians[name] = [statistics.median(r["dtypes"][name]["seconds"]) for r in results]
        gbps[name] = nbytes / max(medians[name]) * 2 * (world - 1) / world / 1e9
    return Measured(backend, world, hosts, nbytes, gbps, errors, medians)


def floor_from_calibration(gbps: list[float]) -> Threshold:
    """The floor of one dtype's bus bandwidth on one world shape, from repeated clean launches
    (``min_speedup`` holds the floor in GB/s: the least the statistic may be)."""
    return threshold_from_calibration(gbps, what="bus bandwidths (GB/s)")


@dataclass(frozen=True)
class Judged:
    """What a measured bandwidth came to against its floor; ``values``: every measurement taken."""

    outcome: Outcome
    values: tuple[float, ...]
    floor: float | None
    note: str


def judge(first: float, threshold: Threshold | None, again: Callable[[], float | None], calibrate: str) -> Judged:
    """``first`` against the class's floor for this shape: UNJUDGED without one (the note says how
    to calibrate), NOISY where calibration could place none (its runs scattered too much), PASS at
    or above it, else measured ``again``: FAIL when that is below too, NOISY when it is not."""
    if threshold is None:
        why = "no floor calibrated for this world's shape"
        return Judged(Outcome.UNJUDGED, (first,), None, f"measured, not judged: {why}; calibrate with `{calibrate}`")
    if not threshold.judged or threshold.min_speedup is None:
        # calibrated, and the calibration found the runs too scattered to place a floor: the host's
        # noise, not a missing calibration (NOT JUDGED would ask again for the one just made)
        return Judged(
            Outcome.NOISY,
            (first,),
            None,
            f"measured, no verdict: {threshold.origin}; a quieter host of the class can place a floor (`{calibrate}`)",
        )
    floor = threshold.min_speedup
    if first >= floor:
        return Judged(Outcome.PASS, (first,), floor, threshold.origin)
    second = again()
    values = (first,) if second is None else (first, second)
    if second is not None and second < floor:
        return Judged(
            Outcome.FAIL,
            values,
            floor,
            f"{first:.3g} and {second:.3g} GB/s, both under the floor {floor:.3g} (the calibrated median slowed "
            f"sqrt({DETECT_SLOWDOWN}) times); {threshold.origin}",
        )
    return Judged(
        Outcome.NOISY, values, floor, f"{first:.3g} GB/s under the floor {floor:.3g}, then not confirmed: {values}"
    )


def bandwidth_claim(measured: Measured, dtype: str, judged: Judged) -> ClaimComparison:
    """A judged bandwidth (PASS or FAIL) as the check's verdict: the least of its measurements
    against the floor this class calibrated for the world's shape."""
    return compare_claim(
        "allreduce.bus_bandwidth",
        min(judged.values),
        judged.outcome is Outcome.PASS,
        f"the all-reduce bus bandwidth is at least the floor calibrated for {measured.case} on this class",
        detail=f"{dtype}: {judged.note}",
        expected=judged.floor,
        allowance=judged.floor,
        unit="GB/s",
    )


def measured_claim(measured: Measured) -> ClaimComparison:
    """The precondition of any bandwidth verdict: the backend all-reduced at least one dtype."""
    count = sum(g is not None for g in measured.gbps.values())
    return compare_claim(
        "allreduce.bandwidth_dtypes_measured",
        count,
        count > 0,
        "the backend all-reduces at least one of the dtypes",
        detail=f"no dtype could be all-reduced on {measured.backend}: {measured.errors}",
        expected=len(DTYPES),
        unit="dtypes",
    )


# -- the rank program --------------------------------------------------------------------------------
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

    import torch
    import torch.distributed as dist

    from harness.domains.engines.ranks.ranks import rank_device, resolve  # lazy: imports torch, in the rank

    reduce = resolve(all_reduce)

    device = rank_device(rank)
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
