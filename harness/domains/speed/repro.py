"""A failed speed check as a script: the workload's own source, timed as the check times it.

A speedup is a property of a machine, so the script is a benchmark to run on a machine of the
class that failed: AMP against fp32 in interleaved rounds (fp32 block, AMP block, ...), on this
thread's CPU time with torch on one thread (CUDA: events after a synchronise), the median of the
rounds' ratios, against the class's calibrated threshold. As in the check, a failure counts only
when a second measurement confirms it. The contention probe and the busy-machine rule stay in the
harness: run the script on an idle machine. The all-reduce floor's script forks gloo ranks and
holds their bus bandwidth to the class's floor (``scripts/interconnect.py``).
"""

from __future__ import annotations

import torch

from harness.domains.engines.bench.bench import BLOCK_S, CPU_THREADS, MIN_ROUNDS
from harness.domains.engines.bench.workload import Workload
from harness.domains.repro import FailureRepro, ScriptTemplate
from harness.domains.speed.workloads import SPEEDUP


def repro_of(
    workload: Workload, dtype_name: str, threshold: float, origin: str, rounds: int, device: torch.device
) -> FailureRepro | None:
    """The script of a speedup below ``threshold`` (``origin``: where it comes from), or None where
    the workload has no script (compiled paths, a baseline other than fp32)."""

    if workload.script is None or workload.baseline is not None or workload.compiled_paths:
        return None
    prelude = workload.script.prelude()
    if prelude is None:
        return None
    values = {
        "NAME": repr(workload.name),
        "DEVICE": f"torch.device({device.type!r})",
        "DTYPE": f"torch.{dtype_name}",
        "THRESHOLD": repr(threshold),
        "ROUNDS": repr(max(MIN_ROUNDS, rounds)),
        "BLOCK_S": repr(BLOCK_S),
        "THREADS": repr(CPU_THREADS),
    }
    constants = "# the workload, as the harness builds it from this text\n" + prelude[0].rstrip("\n")
    # one fill, so that the script imports what its timing block uses (time, statistics) too
    body = f"{constants}\n\n\n{workload.script.source.strip()}"
    code = SPEEDUP.fill("parameters", "constants", "timing", values=values, replace={"constants": body})
    return FailureRepro(
        "speed",
        f"{workload.name}: the {dtype_name} autocast path's speedup over fp32 on {device.type}, interleaved "
        "(run it on an idle machine of the class that failed)",
        code,
        origin,
        prelude[1],
        device=device.type,
    )


#: the all-reduce's bus bandwidth against the class's floor, standalone: ``scripts/interconnect.py``
INTERCONNECT = ScriptTemplate(__package__ or "harness.domains.speed", "interconnect")


def interconnect_repro(
    backend: str, world: int, nbytes: int, repeats: int, dtype: str, floor: float
) -> FailureRepro | None:
    """A failed all-reduce floor as a script forking ``world`` gloo ranks (None for another backend:
    NCCL's world is the launcher's, not a script's)."""
    if backend != "gloo":
        return None
    values = {
        "WORLD": repr(world),
        "DTYPE": f"torch.{dtype}",
        "BANDWIDTH_BYTES": repr(nbytes),
        "REPEATS": repr(repeats),
        "FLOOR": repr(floor),
    }
    code = INTERCONNECT.fill("parameters", "measure", "floor", values=values)
    what = f"the {dtype} all-reduce's bus bandwidth on {world} gloo ranks under the class's floor"
    return FailureRepro(
        "speed", what, code, "the calibrated median slowed sqrt(1.3) times, confirmed twice", device="cpu"
    )
