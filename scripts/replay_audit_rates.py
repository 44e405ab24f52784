"""Error rates of the DDP replay audit (``harness.api.ReplayAudit``) on this machine
(docs/decision-rules.md has the figures).

A user's DDP training (bf16 autocast, dropout: ``tests/faults/known_answers.py``) on gloo ranks,
audited on every step. False alarms: STEPS clean audit steps on 3 ranks and on 2. A persistent
fault (a stuck lane in rank 1's bf16 GEMM unit): the audit steps that name rank 1. Intermittent
faults (one bit flipped in one bf16 GEMM call in N on rank 1): per audit step, the share caught,
named rightly, left undecided, and any healthy rank named (a false accusation), against the
probability that a flip lands in the step's 24 bf16 GEMM calls at all (1 - (1 - 1/N)^24).
Run it on each kernel set (``amp-harness kernels avx2 -- python scripts/replay_audit_rates.py``).

    python scripts/replay_audit_rates.py [--steps 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from harness.domains.engines.ranks.ranks import launch  # noqa: E402
from harness.platform.hardware import detect  # noqa: E402

PROGRAM = "faults.known_answers:audited_ddp_training"
RATES = (10, 100, 1_000)
#: bf16 GEMM calls of one audit step: three passes of three Linear layers, each forward one addmm
#: and backward two mm (the first layer's input needs no gradient: one)
CALLS_PER_AUDIT = 3 * (3 + 3 + 2)


def _tally(audits: list[dict[str, Any]], faulty: int | None) -> dict[str, Any]:
    verdicts = Counter(a["verdict"] for a in audits)
    named = sum(1 for a in audits if a["verdict"] == "suspect" and a["suspects"] == [faulty])
    wrong = sum(1 for a in audits if a["verdict"] != "undecided" and any(r != faulty for r in a["suspects"]))
    return {"audits": len(audits), "verdicts": dict(verdicts), "named_faulty_alone": named, "named_healthy": wrong}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    out: dict[str, Any] = {"class": detect().cpu_class.id, "torch": torch.__version__, "steps": args.steps}
    kw = {"steps": args.steps, "every": 1}
    for world in (3, 2):
        t0 = time.monotonic()
        audits = launch(PROGRAM, world=world, timeout_s=1800, **kw)[0]
        out[f"clean_{world}"] = {**_tally(audits, None), "s_per_audit": (time.monotonic() - t0) / args.steps}
    out["stuck_lane_3"] = _tally(launch(PROGRAM, world=3, timeout_s=1800, fault="stuck_lane", **kw)[0], 1)
    for every in RATES:
        audits = launch(PROGRAM, world=3, timeout_s=1800, fault="intermittent", flip_every=every, **kw)[0]
        out[f"intermittent_1_in_{every}"] = {
            **_tally(audits, 1),
            "p_flip_in_audit": 1 - (1 - 1 / every) ** CALLS_PER_AUDIT,
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
