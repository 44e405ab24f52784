"""Negative controls: the stochastic-rounding suite, run on deliberately wrong roundings, must fail.

The real suite file is copied into a scratch directory; a conftest swaps in a broken rounding
(``faults/stochastic_rounding.py``); each test asserts exactly which checks catch the fault, and the unbiasedness
check's error rates are measured.
"""

from __future__ import annotations

import pytest
from helpers import assert_caught, assert_clean, inject, run_inner

pytest.importorskip(
    "torchao", reason="the stochastic-rounding suite's controls need torchao (pip install amp-harness[fp8])"
)


# -- stochastic rounding ------------------------------------------------------------------------------
SR = "stochastic_rounding/test_stochastic_rounding.py"
SR_UNBIASED = "test_every_draw_is_a_neighbour_and_the_draws_are_unbiased"
SR_DRAWS = "test_draws_differ_between_seeds_and_repeat_with_one"


def _sr(pytester, suite_copy, fault: str | None):
    """The stochastic-rounding checks with ``fault`` in both roundings (bf16 and e2m1) at once: each
    format's checks are tests of their own, so one run shows each rounding fails exactly its own."""
    suite_copy(SR, conftest=False)
    if fault is None:
        fixtures = {
            "stochastic_rounding_under_test": "faults.stochastic_rounding.torchao_sr()",
            "e2m1_stochastic_rounding_under_test": "harness.domains.stochastic_rounding.roundings.harness_e2m1_stochastic_rounding",
        }
    else:
        fixtures = {
            "stochastic_rounding_under_test": f"faults.stochastic_rounding.SR_FAULTS[{fault!r}]",
            "e2m1_stochastic_rounding_under_test": f"faults.stochastic_rounding.E2M1_SR_FAULTS[{fault!r}]",
        }
    inject(
        pytester, "stochastic_rounding", fixtures=fixtures, imports=("harness.domains.stochastic_rounding.roundings",)
    )
    return run_inner(pytester)


def test_torchaos_bf16_and_the_harness_e2m1_stochastic_rounding_pass_every_check(pytester, suite_copy):
    assert_clean(_sr(pytester, suite_copy, None), at_least=4)


@pytest.mark.parametrize(
    ("fault", "caught", "says"),
    [
        ("round_to_nearest", (SR_UNBIASED, SR_DRAWS), "*sr_{}.smallest_adjusted_p_value: FAILED*"),
        ("biased_an_eighth", (SR_UNBIASED,), "*sr_{}.smallest_adjusted_p_value: FAILED*"),
        ("zeros", (SR_UNBIASED, SR_DRAWS), "*sr_{}.off_support_draws: FAILED*"),
        ("deterministic", (SR_UNBIASED, SR_DRAWS), "*sr_{}.halfway_draws_both_neighbours: FAILED*"),
        ("ignores_the_generator", (SR_DRAWS,), "*sr_{}.seeds_draw_differently: FAILED*"),
        ("unseeded", (SR_DRAWS,), "*sr_{}.one_seed_repeats: FAILED*"),
    ],
)
def test_a_broken_stochastic_rounding_fails_exactly_its_checks(pytester, suite_copy, fault, caught, says):
    """Each fault, in the bf16 and in the e2m1 rounding, fails exactly its checks in both formats
    (all zeros is what one GPU generation's NVFP4 rounding returned: TransformerEngine PR 3281)."""
    run = _sr(pytester, suite_copy, fault)
    assert_caught(run, *(f"*::{t}[[]{fmt}]" for t in caught for fmt in ("bf16", "e2m1")))  # [[] is a literal [
    run.stdout.fnmatch_lines([says.format(fmt) for fmt in ("bf16", "e2m1")], consecutive=False)


@pytest.mark.amp_thorough
@pytest.mark.parametrize("fmt", ["bf16", "e2m1"])
def test_the_unbiasedness_check_rarely_fails_a_correct_rounding_and_catches_an_eighth_of_a_step(fmt):
    """The false-alarm rate and the power, measured: a correct rounding (torchao's into bf16, the
    harness's into e2m1) over 200 seeds never fails (designed: 1e-6 per run); a bias of 1/8 of a
    step fails every seed (the detectable bias is 0.062-0.064 of a step where the test is weakest,
    p = 1/2; near the ends of the step far smaller biases show)."""
    from faults.stochastic_rounding import E2M1_SR_FAULTS, SR_FAULTS, torchao_sr

    from harness.domains.stochastic_rounding import checks as S
    from harness.domains.stochastic_rounding import roundings

    target = S.TARGETS[fmt]
    correct = torchao_sr() if fmt == "bf16" else roundings.harness_e2m1_stochastic_rounding
    biased = (SR_FAULTS if fmt == "bf16" else E2M1_SR_FAULTS)["biased_an_eighth"]
    x = target.inputs()

    def fails(rounding, seed):
        return not S.judge_draws(x, S.draw(rounding, x, S.DRAWS, seed), target).unbiased

    clean = sum(fails(correct, s) for s in range(S.MEASURED_FALSE_ALARMS[1]))
    assert clean == S.MEASURED_FALSE_ALARMS[0], f"{clean} false alarms in {S.MEASURED_FALSE_ALARMS[1]} runs"
    assert all(fails(biased, s) for s in range(20))
