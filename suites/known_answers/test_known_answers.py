"""Claim family: the card gives, bit for bit, the known answers a healthy card of its hardware class
and software stack recorded.

Each computation (``harness/domains/known_answers/computations.py``: bf16 and fp16 GEMMs through
linear, addmm and bmm, attention, layer_norm, softmax, fp8 scaled matmul, one GradScaler'd
transformer step) runs deterministically on fixed inputs, and its output's bits are compared with
the answer recorded for this hardware class and exact torch (and CUDA) release. A unit wrong by
one ulp, persistently or now and then, passes every tolerance and fails here. A class or stack
with no recorded answers is NOT JUDGED, saying how to record a healthy card's (``--amp-regen``):
answers of another class or release are other bits, never a reference.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.known_answers import answers as ka
from harness.domains.known_answers.repro import answer_repro_of
from harness.numerics.verdict import Outcome
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("known answers")


@pytest.mark.parametrize("name", sorted(ka.COMPUTATIONS))
def test_the_card_gives_the_known_answer_its_class_recorded_bit_for_bit(
    name, amp_device, amp_record, amp_baseline, amp_hardware_class
):
    answer, why = ka.attempt(name, amp_device)
    if answer is None:
        pytest.skip(why)
    cls = amp_hardware_class.hardware_class
    baseline = ka.baseline_name(cls, name)
    got = ka.encode(answer)
    tags = {"sha256": got["sha256"], "hardware_class": cls, "computation": name}
    if not amp_baseline.has(baseline, key=KeyKind.STACK, device=str(amp_device)):
        note = (
            f"NOT JUDGED: no known answers recorded for {cls} on torch {torch.__version__}; on a healthy card, "
            f"record them: pytest suites/known_answers --amp-regen (this one: {amp_baseline.regen_command()})"
        )
        amp_record(f"known_answer.{name}", None, outcome=Outcome.UNJUDGED, device=amp_device, tags=tags, note=note)
        pytest.skip(note)
    amp_baseline.check(
        baseline,
        got,
        key=KeyKind.STACK,
        device=str(amp_device),
        comparator=lambda stored, obtained: ka.compare(name, stored, obtained),
        tags=tags,
        repro=lambda _changed, stored: answer_repro_of(name, ka.decode(stored), amp_device),
    )
