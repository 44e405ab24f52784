"""The outcome of a check: one enum for rows, tests, the qualification verdict and the dashboard.

A verdict is decided once (a comparison's ``passed``, a speed rule, a baseline lifecycle) and then
carried as an :class:`Outcome`; the report row and the assertion are both made from that value, so
they cannot disagree. Nothing downstream parses message text to learn what happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class Outcome(str, Enum):
    """What one measurement (a report row) or one test came to.

    The values are the strings stored in the ``outcome`` column of a run report.
    """

    #: judged against an allowance or expectation, and met it
    PASS = "pass"
    #: judged, and missed it
    FAIL = "fail"
    #: information only: counts, maxima over random samples, intermediate values
    INFO = "info"
    #: measured but not judged: nothing to judge it against here yet (an uncalibrated hardware
    #: class); the row's note says why and what command would make it judged
    UNJUDGED = "unjudged"
    #: judged, but the measurement's own spread straddles the threshold: no verdict either way
    NOISY = "noisy"
    #: not measured
    SKIP = "skip"
    #: a known, registered deviation (a finding of the stack with a check that notices a fix)
    KNOWN = "known"
    #: the check ran but tested nothing it claims (a training run whose optimizer steps were
    #: mostly skipped, or whose parameters did not move): neither pass nor a regression; the row
    #: carries the counts. The test fails, so that a vacuous check is never green
    INCONCLUSIVE = "inconclusive"
    #: the test ran past its time limit (``--amp-timeout``): stopped, with the stacks of its
    #: process's threads; a stack that never returns fails as surely as a wrong number
    HUNG = "hung"
    #: the process running the test died during it (a signal, or an exit without pytest's report):
    #: the test's result names the signal or exit status and the last row it recorded
    CRASHED = "crashed"

    @classmethod
    def parse(cls, value: Outcome | str) -> Outcome:
        """An outcome from its report string; a bad one is an error that lists the choices."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"row outcome {value!r} is not one of {', '.join(o.value for o in cls)}") from None

    @classmethod
    def of(cls, passed: bool) -> Outcome:
        """The outcome of a judged check."""
        return cls.PASS if passed else cls.FAIL

    @property
    def judged(self) -> bool:
        """Whether a verdict was reached against a stated expectation (pass, fail, or a known
        deviation confirmed still present): the row is a comparable measurement by default."""
        return self in (Outcome.PASS, Outcome.FAIL, Outcome.KNOWN)

    @property
    def fails_test(self) -> bool:
        """Whether a check with this outcome fails its test (a vacuous check is never green)."""
        return self in (Outcome.FAIL, Outcome.INCONCLUSIVE, Outcome.HUNG, Outcome.CRASHED)

    @property
    def broke(self) -> bool:
        """Whether the test did not come to an end of its own: it hung or its process died. Ranked
        with FAIL (it fails its test and its capability), and above it: a run that lost a test to a
        crash knows less than one that failed it."""
        return self in (Outcome.HUNG, Outcome.CRASHED)

    @property
    def severity(self) -> int:
        """The worst-of order every reader uses (a suite cell, a check's status, a capability's
        verdict): what fails a test, then what withholds a verdict, then known deviations, then
        passes, then what judged nothing."""
        return _SEVERITY.index(self)

    @property
    def label(self) -> str:
        """How every reader names it: upper case, ``NOT JUDGED`` and ``SKIPPED`` in words."""
        return _LABELS.get(self, self.value.upper())

    @property
    def known_issue_state(self) -> str:
        """What a known-issue row with this outcome says of the issue (``amp-harness diff``): KNOWN
        where listed and present, PASS where absent, FAIL where the registry disagrees."""
        return _KNOWN_ISSUE_STATES.get(self, self.value)

    @classmethod
    def worst(cls, outcomes: Iterable[Outcome | str]) -> Outcome | None:
        """The most severe of ``outcomes`` (None for none)."""
        parsed = [cls.parse(o) for o in outcomes]
        return max(parsed, key=lambda o: o.severity) if parsed else None

    @classmethod
    def of_test(cls, outcome: str, labels: Iterable[str] = ()) -> Outcome:
        """A test's own result (pytest's ``passed``, ``failed``, ``error``, ``skipped``,
        ``xfailed``, ``xpassed``; JUnit's ``failure``; the harness's ``hung`` and ``crashed``) as an outcome; ``labels``: the row outcomes
        the test recorded, so that a failed test whose verdict was INCONCLUSIVE reads so."""
        seen = {cls.parse(label) for label in labels}
        if outcome in (cls.HUNG.value, cls.CRASHED.value):
            return cls(outcome)
        if outcome in ("failed", "failure", "error"):
            return cls.INCONCLUSIVE if cls.INCONCLUSIVE in seen and cls.FAIL not in seen else cls.FAIL
        bases = {
            "passed": cls.PASS,
            "xpassed": cls.PASS,
            "skipped": cls.SKIP,
            "deselected": cls.SKIP,
            "xfailed": cls.KNOWN,
        }
        if outcome not in bases:
            raise ValueError(f"test outcome {outcome!r} is not a pytest or JUnit outcome")
        # a test that did not fail reads as its worst label: a NOISY speed check is skipped, an
        # unjudged one passes
        worst = cls.worst([bases[outcome], *(o for o in seen if not o.fails_test)])
        assert worst is not None
        return worst

    def __str__(self) -> str:
        return self.value


class RowKind(str, Enum):
    """What a report row is, stored in its ``kind`` column: the readers that treat kinds apart
    (``amp-harness diff``: speedups by the speed rule, policy cells by their category, known
    issues by their presence) read this column, never the metric's name."""

    #: a value, a verdict or information (the default)
    MEASUREMENT = "measurement"
    #: an AMP speedup over its baseline (judged by the speed rule, or not judged on its class)
    SPEEDUP = "speedup"
    #: one cell of the autocast policy table (what autocast ran an op in; ``category`` in tags)
    POLICY = "policy"
    #: a registered known issue, observed (present: KNOWN, absent where unlisted: PASS)
    KNOWN_ISSUE = "known_issue"
    #: the aten ops of one training step (tags: op, module, dtype, shape, output hash per op)
    FINGERPRINT = "fingerprint"

    def __str__(self) -> str:
        return self.value


#: Least to most severe (Outcome.severity).
_SEVERITY = (
    Outcome.SKIP,
    Outcome.INFO,
    Outcome.PASS,
    Outcome.KNOWN,
    Outcome.UNJUDGED,
    Outcome.NOISY,
    Outcome.INCONCLUSIVE,
    Outcome.FAIL,
    Outcome.HUNG,
    Outcome.CRASHED,
)
_LABELS = {Outcome.UNJUDGED: "NOT JUDGED", Outcome.SKIP: "SKIPPED"}
#: Every outcome value, in the order reports list their counts.
OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)


_KNOWN_ISSUE_STATES = {Outcome.KNOWN: "present", Outcome.PASS: "absent", Outcome.FAIL: "registry disagrees"}
