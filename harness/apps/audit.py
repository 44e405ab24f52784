"""``amp-harness audit``: the known answers on several devices of one machine at once, the odd one
out named by majority (GPUs; on a CPU, processes pinned to disjoint cores). With two devices the
class's recorded answers, where there are any, break the tie. The rule is the fleet's
(:func:`harness.domains.known_answers.fleet.outliers`), each device a host of a fleet of one.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from harness.apps.burn_in import recorded_answers
from harness.domains.known_answers.fleet import Observation, Outlier, outliers
from harness.platform.hardware import detect

RECORDED = "recorded answers"


def _answers(device: str, core: int | None) -> dict[str, str]:
    """One device's digests, in a process of its own (pinned to ``core`` on the CPU)."""
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    import torch

    from harness.domains.known_answers import answers as ka  # lazy: imports torch, in the child

    dev = torch.device(device)
    tried = {n: ka.attempt(n, dev)[0] for n in ka.COMPUTATIONS}
    return {n: ka.digest(t) for n, t in tried.items() if t is not None}


def judge(hardware_class: str, stack: str, digests: Mapping[str, Mapping[str, str]]) -> list[Outlier]:
    """The odd devices among ``digests`` (device label -> computation -> digest), by majority; a
    ``RECORDED`` entry votes as one more device."""
    seen = [
        Observation(hardware_class, stack, name, label, "0", digest)
        for label, answers in digests.items()
        for name, digest in answers.items()
    ]
    return outliers(seen)


def main(devices: Sequence[str], processes: int, baseline_dir: Path, out: TextIO | None = None) -> int:
    """Run the audit; 0 every device agrees, 1 one is odd (or undecided), 2 bad input."""
    out = out or sys.stdout
    import torch

    from harness.domains.known_answers import answers as ka  # lazy: imports torch

    cuda = [d for d in devices if d.startswith("cuda")]
    if cuda and not torch.cuda.is_available():
        print(f"amp-harness audit: {', '.join(cuda)}: CUDA is not available here", file=sys.stderr)
        return 2
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    work: list[tuple[str, int | None]] = [(d, None) for d in devices if d != "cpu"]
    if "cpu" in devices:
        if not 1 <= processes <= len(cores):
            print(f"amp-harness audit: --processes {processes}: this machine has {len(cores)} cores", file=sys.stderr)
            return 2
        work += [("cpu", cores[i]) for i in range(processes)]
    if len(work) < 2:
        print("amp-harness audit: name at least two devices (or --processes 2 on the CPU)", file=sys.stderr)
        return 2
    labels = [f"{d} (core {c})" if c is not None else d for d, c in work]
    with multiprocessing.get_context("spawn").Pool(len(work)) as pool:
        results = pool.starmap(_answers, work)
    digests: dict[str, dict[str, str]] = dict(zip(labels, results, strict=True))
    fp = detect()
    recorded, _bad = recorded_answers(baseline_dir, work[0][0])
    if recorded:
        digests[RECORDED] = {n: ka.digest(t) for n, t in recorded.items()}
    odd = judge(fp.class_for(work[0][0]).id, fp.torch_minor, digests)
    names = sorted({n for a in digests.values() for n in a})
    print(f"audit of {', '.join(labels)}{' and the recorded answers' if recorded else ''}: {len(names)} computations",
          file=out)  # fmt: skip
    for o in odd:
        verdict = "disagrees with the majority" if o.majority else "no majority (undecided)"
        print(f"ODD {o.host}: {o.computation} {verdict} ({o.hosts_agreeing} of {o.hosts} agree)", file=out)
    print("AGREE: every device gives the same answers" if not odd else f"{len(odd)} odd answers", file=out)
    return 0 if not odd else 1
