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
from typing import IO, Any


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_mode(directory: bool = False) -> int:
    """What ``open()`` / ``mkdir()`` would give under the current umask (0644 / 0755 under 022)."""
    return (0o777 if directory else 0o666) & ~_umask()


def stage(path: Path, text: str | bytes) -> Path:
    """First half of an atomic write: ``text`` (or bytes) in a temporary sibling of ``path``, fsynced and
    given an ordinary file's permissions; returns the temporary path for :func:`commit`.

    Everything that can fail for want of permission or space fails here, while the caller can
    still say which check it was for; the rename in :func:`commit` needs neither.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8") as fh:
            _write(fh, text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, default_mode())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _write(fh: IO[Any], text: str | bytes) -> None:
    """The one place bytes reach a staged file (tests inject ENOSPC here)."""
    fh.write(text)


def commit(staged: Path, path: Path) -> None:
    """Second half: rename the staged file into place (readers see the old file or the new one)."""
    try:
        os.replace(staged, path)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def discard(staged: Path) -> None:
    staged.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, chmod, rename)."""
    commit(stage(path, text), path)


def write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, chmod, rename)."""
    commit(stage(path, data), path)


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
