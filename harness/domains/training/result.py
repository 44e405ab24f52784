"""What ``amp_training.check`` found, typed: every verdict with its kind and recipe, the census,
the diagnoses and the parity data, so that a caller reads verdicts and never parses a message.

The error a failing check raises (:class:`TrainingCheckFailed`, an ``AssertionError``: pytest
shows it as a failure) carries the same object.

Example::

    try:
        result = amp_training.check(setup, [FP16_SCALER])
    except TrainingCheckFailed as failed:
        result = failed.result
    result.outcome                      # Outcome.INCONCLUSIVE
    [v.name for v in result.failures]   # which verdicts did it
    result.of(Kind.OVERFLOW)            # the overflow-handling verdicts
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from harness.numerics.comparison import AnyComparison, explain
from harness.numerics.verdict import Outcome

if TYPE_CHECKING:
    from harness.domains.engines.training.diagnosis import Diagnosis
    from harness.domains.engines.training.parity import Band, ParityReport, RecipeResult


class Kind(str, Enum):
    """Which rule a verdict comes from."""

    #: AMP against fp32 within the seed band
    PARITY = "parity"
    #: a clipping recipe's clip bound on some step
    CLIPPING = "clipping"
    #: each step against float64 and a correctly rounded emulation
    LANE = "lane"
    #: a canonical broken recipe the lane must see on this setup (the lane's positive control)
    POWER = "power"
    #: bitwise-identical losses on a rerun
    DETERMINISM = "determinism"
    #: a planted non-finite gradient element left everything untouched
    OVERFLOW = "overflow"
    #: saved mid-run and resumed in fresh objects, the run continued bit for bit
    RESUME = "resume"
    #: every module recomputed in the backward (activation checkpointing) ran in its forward's dtypes
    RECOMPUTE = "recompute"
    #: each module's own error in one AMP step within what it owes (a declared-fp32 region: fp32's)
    MODULE_LANE = "module_lane"
    #: the trained parameters keep their fp32 dtypes under autocast (fp32 master weights)
    MASTER_WEIGHTS = "master_weights"
    #: the code ran under autocast in the dtype it was handed (a user's step, a trainer)
    PRECISION = "precision"
    #: the code raised under the recipe (its step and exception named; the other recipes still judged)
    RAISED = "raised"
    #: every loss the code returns under autocast is computed in float32 or wider
    LOSS_PRECISION = "loss_precision"
    #: the GradScaler used as its contract says: update() once per iteration, after every scaled
    #: step, and the scale each iteration leaves the reference state machine's
    SCALER_CONTRACT = "scaler_contract"


@dataclass(frozen=True)
class Checked:
    """One verdict: its rule, the recipe it judged, and the comparison that decided it (the same
    object the report row was made from)."""

    kind: Kind
    recipe: str
    comparison: AnyComparison

    @property
    def name(self) -> str:
        return self.comparison.measurement().metric

    @property
    def outcome(self) -> Outcome:
        return self.comparison.outcome

    @property
    def passed(self) -> bool:
        return self.comparison.passed

    def explain(self) -> str:
        return explain(self.comparison)


@dataclass
class TrainingResult:
    """Every verdict of one ``amp_training.check`` call, and what it measured."""

    setup: str
    #: None where the run could not train (a checkpointed block whose recompute raised)
    parity: ParityReport | None
    verdicts: list[Checked] = field(default_factory=list)
    #: the gradient census (shares of gradients fp16 flushes, and subnormal), where it ran
    census: dict[str, float] | None = None
    #: recipe name -> where its failing AMP run departs from fp32, and the remedy tried
    diagnoses: dict[str, Diagnosis] = field(default_factory=dict)
    #: recipe name -> the smallest gradient noise the lane catches (``ladder=True``; None: none)
    detection_limits: dict[str, float | None] = field(default_factory=dict)
    #: (kind, recipe) -> what was found about a failed verdict beyond it (the first op over its
    #: budget, :mod:`harness.domains.engines.training.diagnosis`), shown after it
    notes: dict[tuple[Kind, str], str] = field(default_factory=dict)

    @property
    def outcome(self) -> Outcome:
        """The worst verdict (:meth:`Outcome.worst`); PASS for a call that judged nothing else."""
        worst = Outcome.worst(v.outcome for v in self.verdicts if v.kind is not Kind.POWER)
        if worst is None or worst.severity < Outcome.PASS.severity:
            return Outcome.PASS
        return worst

    @property
    def failures(self) -> list[Checked]:
        """The verdicts that fail the test (FAIL, INCONCLUSIVE)."""
        return [v for v in self.verdicts if v.outcome.fails_test]

    def of(self, kind: Kind, recipe: str | None = None) -> list[Checked]:
        """The verdicts of one rule (and one recipe, by name)."""
        return [v for v in self.verdicts if v.kind is kind and (recipe is None or v.recipe == recipe)]

    @property
    def results(self) -> list[RecipeResult]:
        """Each recipe's parity data (:class:`~harness.domains.engines.training.parity.RecipeResult`)."""
        return [] if self.parity is None else self.parity.results

    @property
    def band(self) -> Band:
        """The fp32 seed band parity was judged against."""
        if self.parity is None:
            raise ValueError(f"{self.setup}: no parity was judged (the run could not train; see the failures)")
        return self.parity.band

    def explain(self) -> str:
        """The failure message: each failing verdict, then each diagnosis."""
        lines = [f"training checks of {self.setup!r} failed:"]
        for v in self.failures:
            lines.append(v.explain())
            note = self.notes.get((v.kind, v.recipe))
            if note:
                lines.append(note)
            diagnosis = self.diagnoses.get(v.recipe) if v.kind is Kind.PARITY else None
            if diagnosis is not None:
                lines.append(diagnosis.explain())
        return "\n".join(lines)


class TrainingCheckFailed(AssertionError):
    """``amp_training.check`` failed (or was inconclusive): ``.result`` holds every verdict."""

    def __init__(self, result: TrainingResult) -> None:
        super().__init__(result.explain())
        self.result = result
