"""A replay audit's record: one JSON line per audit step, appended and fsynced as the step is
judged, so a job that dies later (or is killed by the failure it found) keeps every verdict it
reached. Every rank reaches the same verdict; one rank (0 by default) writes it.

``AuditLog("audit.jsonl")`` is the ``record`` of a :class:`~harness.domains.known_answers.replay.ReplayAudit`;
:func:`load` reads a log back as a pandas frame, one row per audit step, with the stack and host.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from harness import __version__
from harness.domains.known_answers.replay import AuditResult


class AuditLog:
    """Append each audit step's result to ``path`` (JSON lines) on rank ``writer`` of the default
    process group (every rank holds the same result)."""

    def __init__(self, path: str | os.PathLike[str], writer: int = 0) -> None:
        self.path = Path(path)
        self.writer = writer

    def __call__(self, result: AuditResult) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_rank() != self.writer:
            return
        record: dict[str, Any] = {
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "harness": __version__,
            **result.as_dict(),
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())


def load(path: str | os.PathLike[str]) -> pd.DataFrame:
    """An audit log as a frame (step, verdict, suspects, counts, stack, host); a torn last line (the
    job died writing it) is skipped, anything else unreadable is an error naming the line."""
    rows: list[dict[str, Any]] = []
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: not an audit record ({exc})") from None
        rows.append(
            {
                "time": r.get("time"), "host": r.get("host"), "torch": r.get("torch"), "cuda": r.get("cuda"),
                "step": r["step"], "world": r["world"], "verdict": r["verdict"], "passed": r["passed"],
                "suspects": ",".join(map(str, r.get("suspects", ()))),
                "replay_mismatches": len(r.get("replay_mismatches", ())),
                "self_mismatches": len(r.get("self_mismatches", ())),
                "diverged": ",".join(map(str, r.get("diverged", ()))),
            }
        )  # fmt: skip
    return pd.DataFrame(rows)
