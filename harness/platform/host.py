"""The host's load as this VM sees it: CPU cores other processes keep busy (``/proc/stat``).

Speed checks read it to tell a slow kernel from a busy machine. Other tenants of the physical
host are invisible here; the speed domain's contention probe catches those.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable


def _busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has been busy (user, nice, system, irq, softirq of /proc/stat's
    first line), or None where there is no /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 8 or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def other_processes_load() -> Callable[[], float | None]:
    """Start watching the machine: the returned function gives the CPU cores that processes other
    than this one kept busy, on average, since the call (None where it cannot be read). The
    timing thread's CPU time does not count the time other processes hold the cores, but it does
    count what they cost it through shared caches and memory."""
    busy0, own0, wall0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()

    def load() -> float | None:
        busy, wall = _busy_cpu_s(), time.perf_counter() - wall0
        if busy is None or busy0 is None or wall <= 0:
            return None
        return max(0.0, (busy - busy0) - (_own_cpu_s() - own0)) / wall

    return load
