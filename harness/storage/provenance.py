"""Where a number came from: software stack, device, profile, harness version, time, commit."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import __version__
from harness.platform.hardware import Fingerprint


def git_commit(path: Path) -> str | None:
    """``HEAD`` of the checkout at ``path``, or None; ``+dirty`` when code has local changes
    (changes under ``baselines/`` do not count: regenerating baselines is what makes them)."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)baselines"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def provenance(fp: Fingerprint, *, device: str, profile: str, commit: str | None) -> dict[str, Any]:
    """The provenance block stored in every baseline."""
    device_name = fp.cpu.model
    if device.startswith("cuda") and fp.gpus:
        index = int(device.partition(":")[2] or 0)
        device_name = fp.gpus[min(index, len(fp.gpus) - 1)].name
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "harness": __version__,
        "torch": fp.torch_version,
        "cuda": fp.cuda_version,
        "cudnn": fp.cudnn_version,
        "driver": fp.driver_version,
        "python": fp.python_version,
        "device": device,
        "device_name": device_name,
        "profile": profile,
        "git_commit": commit,
    }
