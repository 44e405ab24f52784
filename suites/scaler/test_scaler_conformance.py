"""Claim family: other loss scalers conform to their stated semantics, and the conformance
machine tells the semantics apart.

Users run the same state machine against their own scaler through an adapter
(:class:`harness.scaling.ScalerAdapter`): ``conformance_machine(make_adapter, semantics)``. The
shipped reference implementations of the Megatron-, DeepSpeed- and Apex-style scalers must pass
their own semantics and fail each other's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from harness import scaling

STEPS = 30


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
        def setup(self, growth_interval, hysteresis, min_scale, init_exp, growth, backoff, raise_at_min):
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
            errors = []
            for fn in (
                lambda: self.adapter.update(found_inf),
                lambda: scaling.update(semantics, self.cfg, self.state, found_inf),
            ):
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
        def clean(self):
            self._event(False)

        @rule()
        def overflow(self):
            self._event(True)

        @invariant()
        def matches_the_specification(self):
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


REFERENCE_SEMANTICS = ["megatron", "deepspeed", "apex"]


@pytest.mark.parametrize("semantics", REFERENCE_SEMANTICS)
def test_reference_scaler_conforms_to_its_semantics(semantics, amp_record):
    machine = conformance_machine(lambda cfg: scaling.reference_adapter(semantics, cfg), semantics)
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=STEPS))
    amp_record(
        f"conformance.{semantics}",
        1,
        outcome="pass",
        note=f"{semantics}-style scaler matches the {semantics} specification",
    )


@pytest.mark.parametrize(
    ("impl", "claimed"), [(a, b) for a in REFERENCE_SEMANTICS for b in REFERENCE_SEMANTICS if a != b]
)
def test_the_machine_tells_scaler_semantics_apart(impl, claimed, amp_record):
    """A negative control: checked against another framework's semantics, a scaler fails."""
    machine = conformance_machine(lambda cfg: scaling.reference_adapter(impl, cfg), claimed)  # type: ignore[arg-type]
    with pytest.raises((AssertionError, Flaky)) as caught:
        run_state_machine_as_test(
            machine,
            settings=settings(
                stateful_step_count=STEPS,
                print_blob=False,
                report_multiple_bugs=False,
                phases=[
                    Phase.explicit,
                    Phase.reuse,
                    Phase.generate,
                ],  # finding one counterexample is the point; no shrinking
            ),
        )
    amp_record(
        f"conformance.{impl}_as_{claimed}",
        0,
        outcome="pass",
        note=str(caught.value).splitlines()[0][:200],
        tags={"implementation": impl, "claimed": claimed},
    )
