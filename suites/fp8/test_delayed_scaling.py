"""Claim family: delayed scaling (an amax history per tensor) does what its specification says.

A hypothesis state machine (``harness/domains/fp8/delayed.py``) draws a configuration (history
length 1-16, ``max`` or ``most_recent``, margin 0-3) and drives the recipe under test through steps
with amaxes across float32's range, zeros, inf and NaN, and through state_dict round trips into a
fresh instance; after every step its scale and history must be a state the specification
(TransformerEngine's recipe) admits, bit for bit: the window rolls, the scale follows the step's own
amax, the margin divides once, an inf or NaN amax enters the window and keeps the scale, an amax of
0 keeps it, an overflowing scale is float32's largest, the round trip loses nothing. Where
TransformerEngine's own update paths differ (NaN in ``max``, a step with amax 0, the margin's
rounding at overflow) either is admitted, and the report counts which was taken. The recipe is the
harness's own plain-torch one by default (``delayed_scaling_under_test``: yours, or
TransformerEngine's through an adapter).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from harness.domains.fp8 import delayed
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("fp8")

#: Rules per example of the machine.
STEPS = 30


def test_delayed_scaling_follows_its_specification(delayed_scaling_under_test, amp_record):
    counts: Counter[str] = Counter()
    machine = delayed.conformance_machine(delayed_scaling_under_test, counts)
    amp_record.require_run(
        "delayed_scaling.conforms",
        "scale and amax history are a state the delayed-scaling specification admits, bit for bit, after every "
        "step and round trip (window rolls, scale from the step's own amax, margin once, inf/NaN amax kept out of "
        "the scale, zero amax keeps it, overflow gives float32's largest)",
        lambda: run_state_machine_as_test(machine, settings=settings(stateful_step_count=STEPS, deadline=None)),
        tags=counts,
        no_script=delayed.NO_SCRIPT,
    )
    exercised = {
        "rolled": "a full window rolled (an entry left it)",
        "non_finite": "a non-finite amax was observed",
        "round_trip": "a state_dict round trip ran",
    }
    amp_record.require_all(
        [
            compare_claim(
                f"delayed_scaling.exercised.{rule}",
                counts[rule],
                counts[rule] > 0,
                criterion,
                detail=f"never: the claim is vacuous there {dict(counts)}",
                inconclusive=True,
            )
            for rule, criterion in exercised.items()
        ]
    )
