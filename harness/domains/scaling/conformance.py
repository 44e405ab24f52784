"""The conformance state machine for loss scalers: run it against any scaler through an adapter.

Pure (no pytest, no paths): ``run_state_machine_as_test(conformance_machine(make_adapter, semantics))``
drives the scaler and :func:`harness.domains.scaling.reference.update` with the same clean/overflow events and
fails at the first difference in scale, growth tracker or at-minimum error.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from harness.domains.scaling import reference as scaling


def conformance_machine(
    make_adapter: Callable[[scaling.ScalerConfig], scaling.ScalerAdapter], semantics: scaling.Semantics
) -> type[RuleBasedStateMachine]:
    class Conformance(RuleBasedStateMachine):
        @initialize(
            growth_interval=st.integers(1, 5),
            hysteresis=st.integers(1, 3),
            min_scale=st.sampled_from([0.0, 1.0, 2.0**10]),
            init_exp=st.integers(0, 24),
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
                max_scale=2.0**24 if semantics == "apex" else scaling.FP32_MAX,
                raise_at_min_scale=raise_at_min,
            )
            self.adapter = make_adapter(self.cfg)
            self.state = scaling.ScalerState.initial(self.cfg)

        def _event(self, found_inf: bool) -> None:
            errors: list[str | None] = []
            calls: tuple[Callable[[], object], ...] = (
                lambda: self.adapter.update(found_inf),
                lambda: scaling.update(semantics, self.cfg, self.state, found_inf),
            )
            for fn in calls:
                result: object
                try:
                    result = fn()
                    errors.append(None)
                except scaling.ScalerAtMinimumError:
                    result = None
                    errors.append("at-minimum")
                if isinstance(result, scaling.ScalerState):
                    self.state = result
            assert errors[0] == errors[1], f"{semantics}: scaler raised {errors[0]!r}, specification {errors[1]!r}"

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
            assert self.adapter.scale() == self.state.scale, (
                f"{semantics}: scaler scale {self.adapter.scale()}, specification {self.state.scale} ({self.state})"
            )
            tracker = self.adapter.growth_tracker()
            if tracker is not None:
                assert tracker == self.state.growth_tracker, (
                    f"{semantics}: growth tracker {tracker}, specification {self.state.growth_tracker}"
                )

    return Conformance
