"""Claim family speed, over the wire: the all-reduce's bus bandwidth on this hardware class holds
the floor calibrated for the world's shape (backend, ranks, hosts).

A timing, so a speed claim whichever ranks run it: it decides the speed capability (``--optional
speed`` leaves it out on a shared host with the other timings). The ranks are the ranks engine's
(gloo on the CPU, NCCL with 2+ GPUs); the statistic and the rule are
``harness/domains/speed/interconnect.py``'s.
"""

from __future__ import annotations

import pytest

from harness.domains.engines.ranks import ranks as dist_h
from harness.domains.speed import interconnect
from harness.domains.speed.repro import interconnect_repro
from harness.numerics.comparison import explain
from harness.numerics.verdict import Outcome

pytestmark = pytest.mark.amp_capability("speed")

#: the ranks the check spawns without a launcher; under one, the launched world's
WORLD = 2


def test_allreduce_bus_bandwidth_meets_the_floor_calibrated_for_this_worlds_shape(
    allreduce_timed, amp_interconnect, amp_record
):
    """All-reduce bus bandwidth per dtype (size / time x 2(n-1)/n, NCCL's tests' statistic, from the
    slowest rank's median all-reduce), judged against the floor ``amp-harness calibrate --allreduce``
    placed for the same backend, ranks and hosts on this hardware class
    (``harness/domains/speed/interconnect.py``); a class or shape without one is measured, not judged."""

    def measure() -> interconnect.Measured:
        kwargs = {"dtypes": list(interconnect.DTYPES), "all_reduce": allreduce_timed}
        return interconnect.from_ranks(dist_h.launch(interconnect.RANK_PROGRAM, world=WORLD, **kwargs))

    first = measure()
    profile = amp_interconnect.load(first.backend)
    confirmations: list[interconnect.Measured] = []

    def again(dtype: str) -> float | None:
        if not confirmations:  # one more launch measures every dtype
            confirmations.append(measure())
        return confirmations[0].gbps.get(dtype)

    device = "cuda" if first.backend == "nccl" else "cpu"
    tags = {"backend": first.backend, "world": first.world, "hosts": first.hosts, "nbytes": first.nbytes}
    missed = []
    for dtype, gbps in first.gbps.items():
        if gbps is None:
            note = f"{first.backend} has no {dtype} all-reduce: {first.errors[dtype]}"
            amp_record("allreduce.bus_bandwidth", None, dtype=dtype, device=device, unit="GB/s", outcome=Outcome.SKIP,
                       note=note, tags=tags)  # fmt: skip
            continue
        threshold = profile.threshold(first.case, dtype)
        judged = interconnect.judge(gbps, threshold, lambda d=dtype: again(d), amp_interconnect.calibrate_command)
        row_tags = {**tags, "values": list(judged.values), "median_s_per_rank": first.median_s_per_rank[dtype]}
        if judged.outcome in (Outcome.PASS, Outcome.FAIL):
            claim = interconnect.bandwidth_claim(first, dtype, judged)
            repro = None
            if judged.outcome is Outcome.FAIL and judged.floor is not None:
                repro = interconnect_repro(
                    first.backend, first.world, first.nbytes, interconnect.BANDWIDTH_REPEATS, dtype, judged.floor
                )
            if not amp_record.result(claim, dtype=dtype, device=device, tags=row_tags, repro=repro):
                missed.append(claim)
        else:
            amp_record("allreduce.bus_bandwidth", gbps, dtype=dtype, device=device, unit="GB/s",
                       outcome=judged.outcome, note=judged.note, tags=row_tags, comparable=False)  # fmt: skip
    amp_record.require(interconnect.measured_claim(first), device=device)
    assert not missed, "\n".join(explain(c) for c in missed)  # verdict recorded
