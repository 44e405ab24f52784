"""``harness.api.check_stochastic_rounding``: a team's rounding judged in a test of its own, by the
same verdicts the fp8 suite's rows use. The harness's e2m1 rounding passes; each fault of the suite's
controls fails, and the explanation names the claim it broke."""

from __future__ import annotations

import pytest
from faults.stochastic_rounding import E2M1_SR_FAULTS, SR_FAULTS

from harness.api import check_stochastic_rounding
from harness.domains.stochastic_rounding import roundings

#: each fault and the words its explanation must carry
BROKEN = {
    "round_to_nearest": "biased",
    "biased_an_eighth": "biased",
    "zeros": "neither e2m1 neighbour",
    "deterministic": "deterministic",
    "ignores_the_generator": "ignores torch's generator",
    "unseeded": "not replayable",
}


def test_the_harness_e2m1_rounding_meets_all_four_claims():
    result = check_stochastic_rounding(roundings.harness_e2m1_stochastic_rounding, "e2m1")
    assert result.passed, result.explain()
    assert result.explain().endswith("all four claims hold")


@pytest.mark.parametrize("fault", sorted(BROKEN))
def test_a_broken_e2m1_rounding_fails_naming_the_claim(fault):
    result = check_stochastic_rounding(E2M1_SR_FAULTS[fault], "e2m1")
    assert not result.passed
    assert BROKEN[fault] in result.explain(), result.explain()


def test_the_bf16_target_judges_a_bf16_rounding():
    assert not check_stochastic_rounding(SR_FAULTS["zeros"], "bf16").passed


def test_an_unknown_target_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"'e3m2'.*\['bf16', 'e2m1'\]"):
        check_stochastic_rounding(roundings.harness_e2m1_stochastic_rounding, "e3m2")
