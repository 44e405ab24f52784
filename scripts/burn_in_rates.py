"""Error rates of the burn-in on this machine (docs/decision-rules.md has the figures).

False alarms: RUNS clean burn-ins of MINUTES each against this machine's answers recorded at the
start (in this process, as ``pytest suites/known_answers --amp-regen`` records them). Detection:
for each flip rate (one bit of one element flipped in one bf16 GEMM call in N, at random:
``tests/faults/known_answers.py``), TRIALS burn-ins of SHORT minutes, the share that found it, and the
bf16 GEMM calls a minute, from which the probability of a detection within m minutes follows
(1 - (1 - 1/N)^(calls a minute x m)). Run it on each kernel set (``amp-harness kernels avx2 --
python scripts/burn_in_rates.py``).

    python scripts/burn_in_rates.py [--runs 10] [--minutes 1] [--trials 10] [--short 0.05]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import faults.known_answers  # noqa: E402  (the harness's own faults: tests/faults)

from harness.domains.known_answers import answers as ka  # noqa: E402
from harness.domains.known_answers import burn_in as B  # noqa: E402
from harness.platform.hardware import detect  # noqa: E402

RATES = (100, 1_000, 10_000, 100_000)
BF16_GEMMS = ("addmm_bf16", "bmm_bf16", "linear_bf16")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--short", type=float, default=0.05)
    args = ap.parse_args()
    cpu = torch.device("cpu")
    tried = {n: ka.attempt(n, cpu)[0] for n in ka.COMPUTATIONS}
    recorded = {n: t for n, t in tried.items() if t is not None}
    out: dict[str, object] = {"class": detect().cpu_class.id, "torch": torch.__version__}
    alarms, reps = [], []
    for _ in range(args.runs):
        r = B.run(cpu, args.minutes, recorded)
        alarms.append(len(r.findings))
        reps.append(r.repetitions / (r.elapsed_s / 60.0))
    out["clean"] = {"runs": args.runs, "minutes": args.minutes, "false_alarms": alarms, "repetitions_per_min": reps}
    calls_per_min = min(reps) * len(BF16_GEMMS)
    detection = {}
    for every in RATES:
        found = 0
        t0 = time.monotonic()
        for trial in range(args.trials):
            lib = faults.known_answers.register_bf16_gemm_intermittent_flip(seed=trial, every=every)
            try:
                found += not B.run(cpu, args.short, recorded, replays=1).passed
            finally:
                lib._destroy()
        predicted = {m: 1 - (1 - 1 / every) ** (calls_per_min * m) for m in (args.short, 1, 10, 60)}
        detection[str(every)] = {
            "trials": args.trials, "minutes": args.short, "detected": found, "predicted": predicted,
            "seconds": time.monotonic() - t0,
        }  # fmt: skip
    out["bf16_gemm_calls_per_min"] = calls_per_min
    out["detection"] = detection
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
