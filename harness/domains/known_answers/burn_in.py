"""Burn-in: the known answers looped for a time budget, each repetition compared bitwise with the
first and with the answers a healthy card recorded, every mismatch replayed to classify it.

A mismatch is replayed REPLAYS times (Megatron-LM's rerun state machine: rerun a suspicious
computation to tell a transient fault from a persistent one): **persistent** when every replay
disagrees again, **intermittent** when some do, **transient** when none does. Rates are per hour
and per 10^12 FLOP of the computations run (DCGM's levels and the fleet studies of silent data
corruption measure in both).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from harness.domains.known_answers.answers import Mismatch, attempt, mismatch
from harness.domains.known_answers.computations import COMPUTATIONS, answer

#: replays of a mismatching computation: enough that a fault present in half the calls shows in
#: some of them with probability 1 - 2^-5 (97%), few enough to cost a fraction of a second
REPLAYS = 5


def flops(name: str) -> int:
    """The computation's floating-point operations: 2mnk a GEMM (the fused step: three GEMM passes
    over its parameters per token, forward and backward), the elements of an elementwise op."""
    return {
        "linear": 2 * 64 * 128 * 96,
        "addmm": 2 * 64 * 96 * 80,
        "bmm": 2 * 4 * 32 * 48 * 72,
        "sdpa": 2 * 2 * (2 * 4 * 32 * 32 * 16),
        "layer_norm": 8 * 64 * 96,
        "softmax": 5 * 64 * 96,
        "scaled_mm": 2 * 32 * 64 * 48,
        "scaled_step": 3 * 2 * 8803 * 32,
    }[COMPUTATIONS[name][0].__name__]


class Kind(str, enum.Enum):
    """What the replays say of a mismatch."""

    PERSISTENT = "persistent"
    INTERMITTENT = "intermittent"
    TRANSIENT = "transient"


@dataclass(frozen=True)
class Finding:
    """One mismatch: the computation, the repetition it came in, what it disagreed with (the
    recorded answer or the first repetition), where, and what its replays said."""

    name: str
    repetition: int
    against: str
    where: Mismatch
    replays_disagreeing: int
    replays: int
    observed: torch.Tensor = field(repr=False)
    reference: torch.Tensor = field(repr=False)

    @property
    def kind(self) -> Kind:
        if self.replays_disagreeing == self.replays:
            return Kind.PERSISTENT
        return Kind.INTERMITTENT if self.replays_disagreeing else Kind.TRANSIENT

    def describe(self) -> str:
        return (
            f"{self.name}, repetition {self.repetition}, against {self.against}: {self.where.describe()}; "
            f"{self.kind.value} ({self.replays_disagreeing} of {self.replays} replays disagreed again)"
        )


@dataclass(frozen=True)
class BurnIn:
    """A burn-in's result: repetitions of every computation, their FLOP and time, the findings."""

    computations: tuple[str, ...]
    repetitions: int
    elapsed_s: float
    flop: int
    findings: tuple[Finding, ...]
    #: computations the stack cannot run, with why
    left_out: Mapping[str, str]
    #: whether a healthy card's recorded answers were the reference (else the first repetition only)
    recorded: bool

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def per_hour(self) -> float:
        return len(self.findings) / (self.elapsed_s / 3600.0) if self.elapsed_s > 0 else 0.0

    @property
    def per_tflop(self) -> float:
        return len(self.findings) / (self.flop / 1e12) if self.flop else 0.0


Progress = Callable[[int, float, int], None]


def run(
    device: torch.device,
    minutes: float,
    recorded: Mapping[str, torch.Tensor] | None = None,
    *,
    names: tuple[str, ...] | None = None,
    replays: int = REPLAYS,
    progress: Progress | None = None,
    on_finding: Callable[[Finding], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> BurnIn:
    """Loop the known answers on ``device`` for ``minutes`` (at least one repetition). Each
    repetition is compared with ``recorded`` (a healthy card's answers, where given) and with the
    first repetition; ``progress(repetitions, elapsed_s, findings)`` is called after each
    repetition, ``on_finding`` at each finding (a journal: nothing found is lost if the process
    dies later)."""
    if minutes <= 0:
        raise ValueError(f"a burn-in needs a positive number of minutes, got {minutes}")
    left_out: dict[str, str] = {}
    first: dict[str, torch.Tensor] = {}
    for name in names or tuple(COMPUTATIONS):
        got, why = attempt(name, device)
        if got is None:
            left_out[name] = str(why)
        else:
            first[name] = got
    order = tuple(first)
    findings: list[Finding] = []
    start = clock()
    flop, repetition = 0, 0

    def judge(name: str, got: torch.Tensor, rep: int) -> None:
        references = []
        if recorded is not None and name in recorded:
            references.append(("the recorded answer", recorded[name]))
        if rep > 0:
            references.append(("the first repetition", first[name]))
        for against, reference in references:
            where = mismatch(reference, got)
            if where is None:
                continue
            replayed = [answer(name, device) for _ in range(replays)]
            again = sum(mismatch(reference, r) is not None for r in replayed)
            found = Finding(name, rep, against, where, again, replays, got, reference)
            if rep > 0 and reference is first[name] and all(mismatch(got, r) is None for r in replayed):
                # every replay agrees with this repetition, not with the first: the first was the odd one
                found = Finding(
                    name, 0, "its own replays", mismatch(got, reference) or where, 0, replays, reference, got
                )
                first[name] = got
            findings.append(found)
            if any(f.name == name for f in findings[:-1]):  # the first finding of a computation keeps its tensors
                findings[-1] = dataclasses.replace(found, observed=torch.empty(0), reference=torch.empty(0))
            if on_finding is not None:
                on_finding(found)
            return  # one finding per computation and repetition

    while True:
        for name in order:
            got = first[name] if repetition == 0 else answer(name, device)
            flop += flops(name)
            judge(name, got, repetition)
        repetition += 1
        elapsed = clock() - start
        if progress is not None:
            progress(repetition, elapsed, len(findings))
        if elapsed >= minutes * 60.0:
            return BurnIn(order, repetition, elapsed, flop, tuple(findings), left_out, recorded is not None)
