"""Release version strings parsed once: ``release("0.17.1+cpu") == (0, 17, 1)``,
``minor("2.13.0+cpu") == "2.13"``; for torch, torchao, DeepSpeed and megatron-core alike."""

from __future__ import annotations

import re


def release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string such as ``0.17.1+cpu`` or ``0.16.1rc2``."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version.strip())
    if match is None:
        raise ValueError(f"not a release version: {version!r}")
    return tuple(int(g or 0) for g in match.groups())


def minor(version: str) -> str:
    """``"2.13"`` of ``"2.13.0+cpu"``."""
    return ".".join(str(n) for n in release(version)[:2])
