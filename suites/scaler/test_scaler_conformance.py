"""Claim family: other loss scalers conform to their stated semantics, and the conformance
machine tells the semantics apart.

Users run the same state machine against their own scaler through an adapter
(:class:`harness.domains.scaling.reference.ScalerAdapter`): ``harness.domains.scaling.conformance.conformance_machine(make_adapter, semantics)``. The
shipped reference implementations of the Megatron-, DeepSpeed- and Apex-style scalers must pass
their own semantics and fail each other's.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from harness.domains.scaling import reference as scaling
from harness.domains.scaling.conformance import conformance_machine
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("loss scaling")

#: Rules per example of the conformance machine.
STEPS = 30


REFERENCE_SEMANTICS = ["megatron", "deepspeed", "apex"]


@pytest.mark.parametrize("semantics", REFERENCE_SEMANTICS)
def test_reference_scaler_conforms_to_its_semantics(semantics, amp_record):
    machine = conformance_machine(lambda cfg: scaling.reference_adapter(semantics, cfg), semantics)
    run_state_machine_as_test(machine, settings=settings(stateful_step_count=STEPS))
    amp_record.require(
        compare_claim(
            f"conformance.{semantics}",
            1,
            True,  # reaching this line is the verdict: the machine raised on any divergence
            f"{semantics}-style scaler matches the {semantics} specification",
        )
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
    amp_record.require(
        compare_claim(f"conformance.{impl}_as_{claimed}", 0, True, f"a {impl}-style scaler fails {claimed} semantics"),
        note=str(caught.value).splitlines()[0][:200],
        tags={"implementation": impl, "claimed": claimed},
    )
