"""The families' hypothesis state machines share one base: a machine is a module-level class
whose parameters (the scaler under test, the device, a tally) are class attributes set by
:meth:`RecordedMachine.bound`, and whose rules record each example as it runs, so that the
failing example hypothesis replays last can be written as a standalone script.

Example::

    machine = GradScalerMachine.bound(device=device, scaler_cls=torch.amp.GradScaler)
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=20))
    machine.transcript   # [("setup", {...}), ("clean_step", {}), ...] of the last example
    machine.counts       # what the rules exercised
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any, ClassVar, Self

from hypothesis.stateful import RuleBasedStateMachine


class RecordedMachine(RuleBasedStateMachine):
    """A state machine that records its rules. Subclasses define rules and invariants at module
    level; a suite runs ``Subclass.bound(...)``, never the class itself."""

    #: each example's rules as they run (``start`` begins an example): the last one run is the
    #: failing example hypothesis replays
    transcript: ClassVar[list[tuple[str, Any]]] = []
    #: tallies the rules keep (what the run exercised)
    counts: ClassVar[Counter[str]] = Counter()

    @classmethod
    def bound(
        cls,
        *,
        transcript: list[tuple[str, Any]] | None = None,
        counts: Counter[str] | None = None,
        **parameters: Any,
    ) -> type[Self]:
        """A subclass with ``parameters`` as class attributes (functions kept unbound) and a
        transcript and tally of its own (or the caller's lists)."""
        attributes: dict[str, Any] = {
            k: staticmethod(v) if inspect.isfunction(v) or inspect.ismethod(v) else v for k, v in parameters.items()
        }
        attributes["transcript"] = transcript if transcript is not None else []
        attributes["counts"] = counts if counts is not None else Counter()
        return type(cls.__name__, (cls,), attributes)

    def start(self, setup: Any) -> None:
        """A new example begins with ``setup``: the transcript holds this example only."""
        self.transcript.clear()
        self.transcript.append(("setup", setup))

    def record(self, rule: str, value: Any) -> None:
        """One rule of the example, with what it was drawn."""
        self.transcript.append((rule, value))
