"""Fleet outliers: per hardware class, stack and computation, the hosts whose known answers disagree
with the majority of the hosts that published them (the fleet studies of silent data corruption
find defective cores as the odd ones out among identical machines).

Decided on plain records (no files, no pandas): each host's latest digest is its answer; the
majority digest is the one most hosts give; a host whose latest digest differs is an outlier, with
how many of its runs disagreed over time. Where no digest has a strict majority (two hosts that
disagree, a three-way split), every host is listed as undecided: the class's recorded answers, not
a vote, tell which is right then.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    """One known answer one host published in one run."""

    hardware_class: str
    stack: str
    computation: str
    host: str
    started: str
    digest: str


@dataclass(frozen=True)
class Outlier:
    """A host whose latest answer to ``computation`` is not the majority's (``majority`` None: no
    strict majority among the hosts, so undecided), and how often it disagreed over its runs."""

    hardware_class: str
    stack: str
    computation: str
    host: str
    digest: str
    majority: str | None
    hosts_agreeing: int
    hosts: int
    runs_disagreeing: int
    runs: int


def outliers(observations: Iterable[Observation]) -> list[Outlier]:
    """Every outlier (and every undecided host), sorted by class, stack, computation and host."""
    groups: dict[tuple[str, str, str], dict[str, list[Observation]]] = {}
    for o in observations:
        groups.setdefault((o.hardware_class, o.stack, o.computation), {}).setdefault(o.host, []).append(o)
    out: list[Outlier] = []
    for (cls, stack, name), by_host in sorted(groups.items()):
        if len(by_host) < 2:
            continue  # one host: nothing to compare it with (its recorded answers judge it)
        latest = {h: max(runs, key=lambda r: r.started).digest for h, runs in by_host.items()}
        top, votes = Counter(latest.values()).most_common(1)[0]
        majority = top if votes * 2 > len(latest) else None
        for host in sorted(by_host):
            if latest[host] == majority:
                continue
            runs = by_host[host]
            against = majority if majority is not None else latest[host]
            disagreeing = sum(r.digest != against for r in runs) if majority is not None else len(runs)
            out.append(
                Outlier(cls, stack, name, host, latest[host], majority, votes, len(latest), disagreeing, len(runs))
            )
    return out
