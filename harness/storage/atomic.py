"""Atomic writes, written once: readers never see half a file or half a run report.

A file is written to a temporary sibling, flushed and fsynced, given the permissions an ordinary
file gets under the process umask (``tempfile`` would leave 0600, and a directory 0700, so a
shared report directory would be unreadable to a dashboard job running as another user), and
renamed into place. A directory is filled under a temporary name and renamed the same way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """What ``open()`` / ``mkdir()`` would give under the current umask (0644 / 0755 under 022)."""
    return (0o777 if directory else 0o666) & ~_umask()


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, chmod, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, default_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def directory(final: Path) -> Iterator[Path]:
    """Fill a temporary sibling of ``final`` inside the block; on success it is renamed to ``final``.

    ``final`` must not exist yet (run reports are never overwritten).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        raise FileExistsError(f"{final} already exists; it is never overwritten")
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, default_mode(directory=True))
        for child in tmp.iterdir():
            if child.is_file():
                os.chmod(child, default_mode())
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
