"""The outcome of a check: one enum for rows, tests, the qualification verdict and the dashboard.

A verdict is decided once (a comparison's ``passed``, a speed rule, a baseline lifecycle) and then
carried as an :class:`Outcome`; the report row and the assertion are both made from that value, so
they cannot disagree. Nothing downstream parses message text to learn what happened.
"""

from __future__ import annotations

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
        """Whether a verdict was reached (the row is a comparable measurement with an allowance)."""
        return self in (Outcome.PASS, Outcome.FAIL)

    def __str__(self) -> str:
        return self.value


#: Every outcome value, in the order reports list their counts.
OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
