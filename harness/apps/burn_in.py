"""``amp-harness burn-in``: the known answers looped on this machine for a time budget.

The recorded answers of this hardware class and torch release (``--baseline-dir``, written by
``pytest suites/known_answers --amp-regen`` on a healthy card) are the reference; without them
each repetition is compared with the first only, which a persistent fault passes (said in the
summary). Every finding is journaled at once (``burn-in.jsonl`` in ``--report-dir``: a crash or a
hang later loses nothing found before it), the first finding of each computation is written as a
standalone script, and the exit status is 0 clean, 1 on any mismatch, 2 on bad input.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from harness.platform.hardware import detect
from harness.storage import atomic
from harness.storage import baselines as bl

SUITE = "known_answers"
#: seconds between progress lines
PROGRESS_S = 10.0


def recorded_answers(baseline_dir: Path, device: str) -> tuple[dict[str, Any], list[str]]:
    """This class's and release's recorded answers under ``baseline_dir`` (name -> tensor), and the
    files that could not be read (a corrupt baseline is named, never used)."""
    from harness.domains.known_answers import answers as ka  # lazy: imports torch

    fp = detect()
    store = bl.BaselineStore(baseline_dir)
    found: dict[str, Any] = {}
    bad: list[str] = []
    for name in ka.COMPUTATIONS:
        path = store.path_for(SUITE, fp.torch_minor, ka.baseline_name(fp.class_for(device).id, name))
        try:
            doc = store.read(path, "record them: pytest suites/known_answers --amp-regen")
        except bl.BaselineError as exc:
            bad.append(str(exc))
            continue
        if doc is not None:
            found[name] = ka.decode(doc.data)
    return found, bad


def main(minutes: float, device_name: str, baseline_dir: Path, report_dir: Path, out: TextIO | None = None) -> int:
    """Run the burn-in and report (to ``out``, stdout by default); the exit status (0 clean, 1 a
    mismatch, 2 bad input)."""
    out = out or sys.stdout
    import torch

    from harness.domains import repro as FR  # lazy: imports torch
    from harness.domains.known_answers import burn_in as B  # lazy: imports torch
    from harness.domains.known_answers.repro import answer_repro_of  # lazy: imports torch

    if not minutes > 0:
        print(f"amp-harness burn-in: --minutes must be positive, got {minutes}", file=sys.stderr)
        return 2
    if device_name.startswith("cuda") and not torch.cuda.is_available():
        print(f"amp-harness burn-in: --device {device_name}: CUDA is not available here", file=sys.stderr)
        return 2
    device = torch.device(device_name)
    recorded, bad = recorded_answers(baseline_dir, device_name)
    for problem in bad:
        print(f"amp-harness burn-in: {problem}", file=sys.stderr)
    report_dir.mkdir(parents=True, exist_ok=True)
    journal = report_dir / "burn-in.jsonl"
    scripted: set[str] = set()
    last = [0.0]

    def write(event: dict[str, Any]) -> None:
        with journal.open("a", encoding="utf-8") as fh:  # appended and flushed line by line
            fh.write(json.dumps(event) + "\n")
            fh.flush()

    def on_finding(f: B.Finding) -> None:
        write({"event": "finding", "time": time.time(), "computation": f.name, "repetition": f.repetition,
               "against": f.against, "kind": f.kind.value, "detail": f.describe()})  # fmt: skip
        print(f"MISMATCH {f.describe()}", file=out, flush=True)
        if f.name not in scripted and f.observed.numel():
            scripted.add(f.name)
            kept = answer_repro_of(f.name, f.reference, device)
            script = report_dir / f"burn_in_{f.name}.py"
            header = [f"Burn-in mismatch on {detect().class_for(device_name).id}, torch {torch.__version__}.",
                      f.describe()]  # fmt: skip
            attachment = f"burn_in_{f.name}.pt"
            if FR.needs_file(kept.tensors):
                atomic.write_bytes(report_dir / attachment, kept.tensor_bytes())
            atomic.write_text(script, FR.render(kept.spec(attachment), kept.tensors, header, attachment))
            print(f"  its script: {script}", file=out, flush=True)

    def progress(reps: int, elapsed: float, findings: int) -> None:
        if elapsed - last[0] >= PROGRESS_S:
            last[0] = elapsed
            print(f"burn-in: {elapsed:.0f} of {minutes * 60:.0f} s, {reps} repetitions, {findings} mismatches", file=out,
                  flush=True)  # fmt: skip
            write({"event": "progress", "time": time.time(), "repetitions": reps, "elapsed_s": elapsed})

    reference = "the recorded answers of a healthy card" if recorded else "the first repetition only"
    print(f"burn-in on {device_name} for {minutes:g} min against {reference} ({len(recorded)} recorded)", file=out)
    result = B.run(device, minutes, recorded or None, progress=progress, on_finding=on_finding)
    summary = {
        "event": "end",
        "passed": result.passed,
        "repetitions": result.repetitions,
        "elapsed_s": result.elapsed_s,
        "flop": result.flop,
        "mismatches": len(result.findings),
        "per_hour": result.per_hour,
        "per_tflop": result.per_tflop,
        "recorded": result.recorded,
        "left_out": dict(result.left_out),
    }
    kinds = {k.value: sum(f.kind is k for f in result.findings) for k in B.Kind}
    summary["kinds"] = kinds  # fmt: skip
    write(summary)
    for name, why in result.left_out.items():
        print(f"left out {name}: {why}", file=out)
    print(
        f"{'CLEAN' if result.passed else 'MISMATCH'}: {result.repetitions} repetitions of {len(result.computations)} "
        f"computations in {result.elapsed_s:.0f} s ({result.flop / 1e12:.3g} TFLOP); {len(result.findings)} mismatches "
        f"({result.per_hour:.3g} per hour, {result.per_tflop:.3g} per 10^12 FLOP; "
        + ", ".join(f"{n} {k}" for k, n in kinds.items())
        + f"); journal {journal}",
        file=out,
    )
    if not recorded:
        print(
            "note: no recorded answers for this class and release: a persistent fault (the same wrong bits every "
            "time) passes a burn-in against its own first repetition; record a healthy card's answers: pytest "
            "suites/known_answers --amp-regen",
            file=out,
        )
    return 0 if result.passed else 1
