"""What a dying process leaves behind: Python's fault handler pointed at the journal, and how the
xdist controller learns which signal ended a worker.

A fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) runs no Python: only the fault handler's
C code writes, to one file descriptor. While a session journals, that descriptor is a pipe into
``tee -a <journal>/<process>.fault``, so the traceback reaches the terminal as pytest's own fault
handler would print it *and* the journal, where recovery reads the signal's name. A time limit's
last resort (:mod:`harness.pytest_plugin.limits`) dumps its stacks into the same pipe. ``SIGKILL``
leaves nothing; a process that saw the dead one end (xdist's controller, ``amp-harness qualify``)
reads its exit status instead.

Captures nest (pytester's in-process sessions inside the harness's own tests): each release
points the fault handler back at what the enclosing session had.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Seconds to wait for a worker's process to be reaped after xdist saw it go down, for its exit
#: status: xdist reports the node down when its channel closes, a moment before the process ends.
REAP_WAIT_S = 2.0
#: Seconds to wait for the tee to end once the session closed its pipe (it ends at once, unless a
#: child the tests forked still holds the pipe: then waiting longer buys nothing).
TEE_WAIT_S = 0.5


@dataclass
class FaultCapture:
    """The fault handler writing into a tee (or the file alone, where ``tee`` is missing)."""

    path: Path
    fd: int
    tee: subprocess.Popen[bytes] | None
    #: what the fault handler wrote to before (None: it was disabled)
    previous: int | None


_STACK: list[FaultCapture] = []
#: the terminal's stderr, duplicated when the session was configured (pytest captures fd 2 while
#: tests run, so it cannot be dup'ed then)
_TERMINAL: list[int] = []


def remember_terminal() -> None:
    """Duplicate the terminal's stderr once, at configure time (capture is suspended then)."""
    if _TERMINAL:
        return
    with contextlib.suppress(OSError, ValueError):
        _TERMINAL.append(os.dup(sys.__stderr__.fileno() if sys.__stderr__ is not None else 2))


def current_fd() -> int | None:
    """The descriptor a time limit's stack dump goes to: the journal's tee, else the terminal."""
    if _STACK:
        return _STACK[-1].fd
    return _TERMINAL[0] if _TERMINAL else None


def capture(path: Path) -> FaultCapture | None:
    """Point the fault handler at ``path`` (through ``tee`` to the terminal as well); None where
    it cannot be (no pipe, no file): the run goes on without a fault record."""
    was_enabled = faulthandler.is_enabled()
    previous = _STACK[-1].fd if _STACK else (_TERMINAL[0] if _TERMINAL and was_enabled else None)
    tee_exe = shutil.which("tee")
    try:
        if tee_exe is not None and _TERMINAL:
            r, w = os.pipe()
            try:
                # -i: an interrupt (Ctrl-C to the process group) must not end the tee before the
                # session's own end; the pipe's end closes it
                tee: subprocess.Popen[bytes] | None = subprocess.Popen(
                    [tee_exe, "-i", "-a", str(path)], stdin=r, stdout=_TERMINAL[0], close_fds=True
                )
            finally:
                os.close(r)
            fd = w
        else:
            fd, tee = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), None
    except OSError:
        return None
    faulthandler.enable(file=fd, all_threads=True)
    cap = FaultCapture(path, fd, tee, previous)
    _STACK.append(cap)
    return cap


def release(cap: FaultCapture | None) -> None:
    """The session ended: the fault handler goes back to what it wrote to before, the tee ends."""
    if cap is None or cap not in _STACK:
        return
    _STACK.remove(cap)
    back = _STACK[-1].fd if _STACK else cap.previous
    if back is not None:
        faulthandler.enable(file=back, all_threads=True)
    else:
        faulthandler.disable()
    with contextlib.suppress(OSError):
        os.close(cap.fd)
    if cap.tee is not None:
        # a child forked by a test may still hold the pipe: never wait on it for long
        with contextlib.suppress(subprocess.TimeoutExpired):
            cap.tee.wait(timeout=TEE_WAIT_S)


def worker_returncode(node: Any) -> int | None:
    """The exit status of an xdist worker's process that went down, where execnet's popen gateway
    exposes it (negative: the signal that ended it); None where it cannot be known."""
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    if popen is None:
        return None
    try:
        return int(popen.wait(timeout=REAP_WAIT_S))
    except (subprocess.TimeoutExpired, OSError, ValueError, TypeError):
        return None
