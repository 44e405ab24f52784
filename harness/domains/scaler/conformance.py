"""The conformance state machine for loss scalers: run it against any scaler through an adapter.

Pure (no pytest, no paths): ``run_state_machine_as_test(conformance_machine(make_adapter, semantics))``
drives the scaler and :func:`harness.domains.scaler.reference.update` with the same clean/overflow events and
fails at the first difference in scale, growth tracker or at-minimum error.

Two ways an adapter talks back, both documented in docs/writing-checks.md ("Checking your own loss scaler"):

- the factory raises :class:`~harness.domains.scaler.reference.ConfigurationDeclined` for a
  configuration its scaler refuses by design: that example is discarded, never a failure;
- ``update`` raises :class:`~harness.domains.scaler.reference.ScalerAtMinimumError` where the
  scaler signals "overflow at the minimum scale" its own way. Any other exception is a failure
  whose message says which of the two the adapter may be missing.

Initial scales are drawn from ordinary values (2^0..2^24) and from near the top of float32
(2^120..2^127), so the growth cap (or its absence) is reached within a few steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.domains.machines import RecordedMachine
from harness.domains.scaler import reference as scaling
from harness.numerics.comparison import ClaimComparison, compare_claim

#: The share of drawn configurations an adapter must accept for its verdict to count. A scaler
#: that fixes one drawn factor declines half by design (DeepSpeed from 0.17.1 has growth 2 only:
#: the machine draws 2 or 4), so "most" is a coin flip there; a quarter is 5 standard deviations
#: below that half over ~100 draws, and still leaves ~25 checked examples.
MIN_ACCEPTED_SHARE = 0.25


def judge_accepted(package: str, counts: Counter[str]) -> ClaimComparison:
    """INCONCLUSIVE where the adapter declined so many configurations that little was checked."""
    drawn = counts["examples"] + counts["declined"]
    accepted = counts["examples"] / drawn if drawn else 0.0
    return compare_claim(
        f"conformance.{package}.configurations_accepted",
        accepted,
        accepted >= MIN_ACCEPTED_SHARE,
        f"the adapter accepts at least {MIN_ACCEPTED_SHARE:g} of the configurations the machine draws "
        "(otherwise little was checked)",
        detail=f"the adapter declined most configurations: {dict(counts)}",
        allowance=MIN_ACCEPTED_SHARE,
        unit="share",
        inconclusive=True,
    )


#: Initial scale exponents: ordinary values, and near the float32 maximum 2^127.99 so that a
#: growth interval of at most 5 reaches the cap within the default step count.
INIT_EXPONENTS = st.one_of(st.integers(0, 24), st.integers(120, 127))


class Conformance(RecordedMachine):
    """A scaler under test (``make_adapter``) against the versioned specification (``semantics``),
    one update at a time: run ``Conformance.bound(make_adapter=..., semantics=...)``. Its counts:
    ``declined``, ``examples``, ``clean``, ``overflow``, ``at_minimum``; its transcript: one
    ``("setup", config fields)`` then one ``("update", found_inf)`` per update."""

    make_adapter: Callable[[scaling.ScalerConfig], scaling.ScalerAdapter]
    semantics: scaling.Semantics

    @initialize(
        growth_interval=st.integers(1, 5),
        hysteresis=st.integers(1, 3),
        min_scale=st.sampled_from([0.0, 1.0, 2.0**10]),
        init_exp=INIT_EXPONENTS,
        growth=st.sampled_from([2.0, 4.0]),
        backoff=st.sampled_from([0.5, 0.25]),
        raise_at_min=st.booleans(),
    )
    def setup(
        self,
        growth_interval: int,
        hysteresis: int,
        min_scale: float,
        init_exp: int,
        growth: float,
        backoff: float,
        raise_at_min: bool,
    ) -> None:
        self.cfg = scaling.ScalerConfig(
            init_scale=2.0**init_exp,
            growth_factor=growth,
            backoff_factor=backoff,
            growth_interval=growth_interval,
            hysteresis=hysteresis,
            min_scale=min_scale,
            max_scale=2.0**24 if self.semantics == "apex" else scaling.FP32_MAX,
            raise_at_min_scale=raise_at_min,
        )
        self.start(asdict(self.cfg))
        try:
            self.adapter = self.make_adapter(self.cfg)
        except scaling.ConfigurationDeclined:
            self.counts["declined"] += 1
            reject()
        except Exception as exc:
            raise AssertionError(
                f"{self.semantics}: the adapter factory raised {type(exc).__name__}({exc}) for {self.cfg}. If the "
                "scaler refuses this configuration by design, raise harness.domains.scaler.reference."
                "ConfigurationDeclined from the factory: the machine then draws another configuration"
            ) from exc
        self.counts["examples"] += 1
        self.state = scaling.ScalerState.initial(self.cfg)

    def _event(self, found_inf: bool) -> None:
        errors: list[str | None] = []
        calls: tuple[Callable[[], object], ...] = (
            lambda: self.adapter.update(found_inf),
            lambda: scaling.update(self.semantics, self.cfg, self.state, found_inf),
        )
        self.counts["overflow" if found_inf else "clean"] += 1
        self.record("update", found_inf)
        for who, fn in zip(("scaler", "specification"), calls, strict=True):
            result: object
            try:
                result = fn()
                errors.append(None)
            except scaling.ScalerAtMinimumError:
                result = None
                errors.append("at-minimum")
            except Exception as exc:
                if who == "specification":
                    raise
                raise AssertionError(
                    f"{self.semantics}: the scaler raised {type(exc).__name__}({exc}) on "
                    f"{'an overflow' if found_inf else 'a clean step'} (specification state {self.state}). If this "
                    "is how it signals an overflow at the minimum scale, translate it into "
                    "harness.domains.scaler.reference.ScalerAtMinimumError in the adapter's update()"
                ) from exc
            if isinstance(result, scaling.ScalerState):
                self.state = result
        if errors[1] == "at-minimum":
            self.counts["at_minimum"] += 1
        if errors[0] != errors[1]:
            raise scaling.Divergence(
                scaling.Diverged.AT_MINIMUM,
                f"{self.semantics}: scaler raised {errors[0]!r}, specification {errors[1]!r}",
            )

    @rule()
    def clean(self) -> None:
        self._event(False)

    @rule()
    def overflow(self) -> None:
        self._event(True)

    @invariant()
    def matches_the_specification(self) -> None:
        if not hasattr(self, "adapter"):
            return
        if self.adapter.scale() != self.state.scale:
            raise scaling.Divergence(
                scaling.Diverged.STATE,
                f"{self.semantics}: scaler scale {self.adapter.scale()}, specification {self.state.scale} ({self.state})",
            )
        tracker = self.adapter.growth_tracker()
        if tracker is not None and tracker != self.state.growth_tracker:
            raise scaling.Divergence(
                scaling.Diverged.STATE,
                f"{self.semantics}: growth tracker {tracker}, specification {self.state.growth_tracker}",
            )


def conformance_machine(
    make_adapter: Callable[[scaling.ScalerConfig], scaling.ScalerAdapter],
    semantics: scaling.Semantics,
    counts: Counter[str] | None = None,
    transcript: list[tuple[str, Any]] | None = None,
) -> type[RuleBasedStateMachine]:
    """:class:`Conformance` bound to the adapter's scaler and ``semantics``; ``counts`` and
    ``transcript`` (optional) receive its tallies and each example as it runs (the last one run is
    the failing example hypothesis replays, a standalone reproduction replays it too)."""
    return Conformance.bound(make_adapter=make_adapter, semantics=semantics, counts=counts, transcript=transcript)


def tells_apart_claim(name: str, criterion: str, divergence: str | None, what: str) -> ClaimComparison:
    """A negative control of the machine itself: run against semantics the scaler does not have,
    the machine must find a ``divergence`` (its description), or it cannot tell ``what`` apart."""
    return compare_claim(
        name,
        divergence is not None,
        divergence is not None,
        criterion,
        detail=f"the machine found no divergence: it cannot tell {what} apart",
    )
