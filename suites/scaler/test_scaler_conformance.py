"""Claim family: other loss scalers conform to their stated semantics, and the conformance
machine tells the semantics apart.

Users run the same state machine against their own scaler through an adapter
(:class:`harness.domains.scaler.reference.ScalerAdapter`):
``harness.domains.scaler.conformance.conformance_machine(make_adapter, semantics)``. The shipped
reference implementations of the Megatron-, DeepSpeed- (both rules) and Apex-style scalers must
pass their own semantics and fail each other's. The real megatron-core and DeepSpeed scalers, where
installed (``tox -e thirdparty``), must pass the semantics of their installed release.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import Phase, settings
from hypothesis.errors import Flaky
from hypothesis.stateful import run_state_machine_as_test

from harness.domains.scaler import adapters
from harness.domains.scaler import reference as scaling
from harness.domains.scaler.conformance import conformance_machine, judge_accepted, tells_apart_claim
from harness.domains.scaler.repro import scaler_conformance
from harness.platform.thirdparty import version_of

pytestmark = pytest.mark.amp_capability("loss scaling")

#: Rules per example of the conformance machine.
STEPS = 30


REFERENCE_SEMANTICS = [s for s in scaling.SEMANTICS if s != "torch"]
#: Settings of a run meant to find one counterexample: no shrinking, no replay blob.
FIND_ONE = settings(
    stateful_step_count=STEPS,
    print_blob=False,
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def _divergence(machine: type) -> str | None:
    """The first line of the divergence the machine finds (one counterexample), None if none."""
    try:
        run_state_machine_as_test(machine, settings=FIND_ONE)
    except (AssertionError, Flaky) as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    return None


def _metric(semantics: str) -> str:
    return semantics.replace("<=", "_le_").replace(">=", "_ge_")


@pytest.mark.parametrize("semantics", REFERENCE_SEMANTICS)
def test_reference_scaler_conforms_to_its_semantics(semantics, amp_record):
    counts: Counter[str] = Counter()
    machine = conformance_machine(lambda cfg: scaling.reference_adapter(semantics, cfg), semantics, counts)
    amp_record.require_run(
        f"conformance.{_metric(semantics)}",
        f"{semantics}-style scaler matches the {semantics} specification (every rule of the state machine)",
        lambda: run_state_machine_as_test(machine, settings=settings(stateful_step_count=STEPS)),
        tags=counts,
    )


@pytest.mark.parametrize("package", sorted(adapters.ADAPTERS))
def test_installed_third_party_scaler_conforms_to_the_semantics_of_its_release(package, amp_record):
    """megatron-core's DynamicGradScaler and DeepSpeed's DynamicLossScaler, as installed, through
    the ready adapters; skipped where the package is not installed (``tox -e thirdparty``)."""
    pytest.importorskip(
        package.replace("-", "."),
        reason=f"{package} is not installed: the opt-in environment `tox -e thirdparty` installs it",
    )
    semantics = adapters.semantics_of(package)
    counts: Counter[str] = Counter()
    transcript: list[tuple[str, object]] = []
    amp_record.require_run(
        f"conformance.{package}",
        f"{package} {version_of(package)} matches the {semantics} specification",
        lambda: run_state_machine_as_test(
            conformance_machine(adapters.ADAPTERS[package], semantics, counts, transcript),
            settings=settings(stateful_step_count=STEPS),
        ),
        tags={"version": version_of(package), "semantics": semantics, "counts": counts},
        repro=lambda error: _conformance_repro(error, package, semantics, transcript),
    )
    amp_record.require(judge_accepted(package, counts))
    for other in REFERENCE_SEMANTICS:
        if other != semantics and scaling.SOURCES[other].framework == scaling.SOURCES[semantics].framework:
            # the other release's rule must fail: versioning the semantics is what makes this pass
            found = _divergence(conformance_machine(adapters.ADAPTERS[package], other))
            amp_record.require(
                tells_apart_claim(
                    f"conformance.{package}_as_{_metric(other)}",
                    f"{package} fails the {other} specification of another release of its framework",
                    found,
                    "the releases' semantics",
                ),
                note=found or "",
            )


#: The divergences a script replays: a scale, a growth tracker or an at-minimum error unlike the
#: rule's (an exception of another kind is the adapter's, and a script could not run past it).
SCRIPTED = (scaling.Diverged.STATE, scaling.Diverged.AT_MINIMUM)


def _conformance_repro(error, package, semantics, transcript):
    """The failing example's iterations as a script that needs only torch and ``package``."""
    found = scaling.divergence_in(error)
    if found is None or found.what not in SCRIPTED:
        return None
    return scaler_conformance(
        f"{package} {version_of(package)}'s scale, growth tracker and at-minimum error through the "
        f"failing example's iterations, against the {semantics} rule",
        package,
        semantics,
        transcript,
    )


@pytest.mark.parametrize(
    ("impl", "claimed"), [(a, b) for a in REFERENCE_SEMANTICS for b in REFERENCE_SEMANTICS if a != b]
)
def test_the_machine_tells_scaler_semantics_apart(impl, claimed, amp_record):
    """A negative control: checked against another framework's semantics, a scaler fails."""
    machine = conformance_machine(lambda cfg: scaling.reference_adapter(impl, cfg), claimed)  # type: ignore[arg-type]
    found = _divergence(machine)
    amp_record.require(
        tells_apart_claim(
            f"conformance.{_metric(impl)}_as_{_metric(claimed)}",
            f"a {impl}-style scaler fails {claimed} semantics (the machine finds a divergence)",
            found,
            "these semantics",
        ),
        note=found or "",
        tags={"implementation": impl, "claimed": claimed},
    )
