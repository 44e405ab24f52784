"""A time limit for every amp-harness test: a hang becomes a HUNG result with the stacks of the
process's threads, and the run goes on.

Two stages. At the limit, ``SIGALRM`` interrupts the main thread, which raises :class:`TestHung`
carrying every thread's stack (a ``BaseException``: a test's ``except Exception`` cannot swallow
it); the test fails as HUNG and the next one runs. That needs the main thread to come back to the
interpreter. A thread stuck in native code (a kernel that spins, a collective that waits forever)
never does, so a last resort is armed too: a GRACE_SHARE of the limit later, the fault handler's
own C thread dumps every thread's stack into the journal's fault file and ends the process. Under
``--amp-isolate`` or xdist a new worker takes the next test; serially the journal names the test
HUNG when the run is recovered.

Limits nest (pytester's in-process sessions run inside the harness's own tests): an inner test's
limit never outlives the enclosing one's, and the enclosing one is re-armed with what remains.
"""

from __future__ import annotations

import faulthandler
import math
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from harness.pytest_plugin import crashes

#: The time limit of an amp-harness test by default: ten minutes, over six times the whole default
#: qualification's 90 s budget on 2 cores of the slowest CPU kind (docs/running.md): no check
#: takes that long unless it never ends.
DEFAULT_LIMIT_S = 600.0
#: The distributed and compiled suites' limit by default: three times the other, for ranks that
#: start and rendezvous (their own collectives time out inside it) and Inductor compiling from an
#: empty cache on a new stack.
DEFAULT_HEAVY_LIMIT_S = 3 * DEFAULT_LIMIT_S
#: The suites under the heavy limit.
HEAVY_SUITES = ("distributed", "compiled")
#: The last resort ends the process this share of the limit after the limit itself: time for the
#: interrupted test's fixtures to tear down, a small part of a limit that is already generous.
GRACE_SHARE = 0.1


class TestHung(BaseException):
    """Raised in the main thread when a test ran past its time limit; ``stacks``: every thread's."""

    __test__ = False  # not a test class, whatever pytest's collection says of the name

    def __init__(self, message: str, stacks: str) -> None:
        super().__init__(message)
        self.stacks = stacks


def stacks_of_threads() -> str:
    """Every thread's Python stack, innermost call last, as a traceback prints it."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"Thread {names.get(ident, '?')} ({ident:#x}):\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


@dataclass
class _Armed:
    """One armed limit: when its last resort fires (monotonic seconds)."""

    hard_at: float


_ARMED: list[_Armed] = []


def _can_interrupt() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float, what: str, option: str, last_resort: bool = True) -> Iterator[None]:
    """Run the block under a ``seconds`` limit (0 or less: none). ``what`` names the test,
    ``option`` the option that sets the limit (both for the message); ``last_resort`` False leaves
    the fault handler's timer alone (pytest's ``faulthandler_timeout`` uses it)."""
    if seconds <= 0 or not math.isfinite(seconds):
        yield
        return
    start = time.monotonic()
    hard_at = start + seconds * (1 + GRACE_SHARE)
    if _ARMED:
        hard_at = min(hard_at, _ARMED[-1].hard_at)
    soft = _can_interrupt()
    previous_handler = None
    previous_timer = (0.0, 0.0)

    def on_alarm(signum: int, frame: object) -> None:
        __tracebackhide__ = True
        raise TestHung(
            f"HUNG: {what} ran past its {seconds:g} s time limit ({option}); the stacks of its threads follow",
            stacks_of_threads(),
        )

    if soft:
        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
        previous_timer = signal.setitimer(signal.ITIMER_REAL, 0)
        limit = seconds if previous_timer[0] <= 0 else min(seconds, previous_timer[0])
        signal.setitimer(signal.ITIMER_REAL, limit)
    armed = _Armed(hard_at)
    if last_resort:
        _ARMED.append(armed)
        _arm_hard(hard_at)
    try:
        yield
    finally:
        if soft:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler if previous_handler is not None else signal.SIG_DFL)
            if previous_timer[0] > 0:  # the enclosing limit, with what remains of it
                left = previous_timer[0] - (time.monotonic() - start)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), previous_timer[1])
        if last_resort:
            _ARMED.remove(armed)
            faulthandler.cancel_dump_traceback_later()
            if _ARMED:
                _arm_hard(_ARMED[-1].hard_at)


def _arm_hard(hard_at: float) -> None:
    """The last resort: at ``hard_at``, the fault handler dumps every stack and ends the process."""
    fd = crashes.current_fd()
    left = max(hard_at - time.monotonic(), 1e-3)
    if fd is None:
        faulthandler.dump_traceback_later(left, exit=True)
    else:
        faulthandler.dump_traceback_later(left, exit=True, file=fd)
