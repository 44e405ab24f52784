"""Claim family: stochastic rounding to bf16 is what it promises, judged statistically.

Every draw is one of the input's two bf16 neighbours; the share of draws away from zero is the
exact probability the fp32 bits give (unbiased), within a binomial test whose designed false-alarm
rate is 1e-6 per run (exact binomial p-values, Bonferroni over the inputs); an input halfway between its neighbours draws both, two seeds draw
differently, one seed draws the same (``harness/domains/fp8/stochastic.py``). The implementation is
torchao's (``stochastic_rounding_under_test``).
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.failure_repro import stochastic_draws, stochastic_rounding
from harness.domains.fp8 import adapters
from harness.domains.fp8 import stochastic as S
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("fp8")

SEED = 20261202


def test_every_draw_is_a_neighbour_and_the_draws_are_unbiased(stochastic_rounding_under_test, amp_record):
    x = S.inputs()
    got = S.draw(stochastic_rounding_under_test, x, S.DRAWS, SEED)
    d = S.judge_draws(x, got)
    # torchao's rounding (the default): a script can call it; a rounding of your own keeps none
    torchaos = stochastic_rounding_under_test is adapters.torchao_stochastic_rounding()
    what = "torchao's fp32 -> bf16 stochastic rounding: draws off the neighbours, or counts not Binomial(n, p)"
    amp_record.require_all(
        [
            compare_claim(
                "sr_bf16.off_support_draws",
                d.off_support,
                d.off_support == 0,
                "every draw is the input's bf16 neighbour toward or away from zero (from the fp32 bits)",
                detail=f"{d.off_support} of {got.numel()} draws were neither neighbour",
                expected=0,
                allowance=0,
                unit="draws",
            ),
            compare_claim(
                "sr_bf16.smallest_adjusted_p_value",
                d.adjusted_p,
                d.adjusted_p >= S.FALSE_ALARM,
                f"over {S.DRAWS} draws of each of {len(x)} inputs, the count away from zero is Binomial(n, p) with p "
                f"from the fp32 bits: every exact two-sided p-value x {len(x)} (Bonferroni) >= {S.FALSE_ALARM:g} (a "
                f"correct rounding fails once in 1e6 runs; a probability bias of {S.detectable_bias(len(x)):.3g} of "
                "a step is caught with 99% power)",
                detail=f"input {d.worst_input!r}: {d.away} of {S.DRAWS} draws away from zero, {d.expected_away:.4g} "
                f"expected; adjusted p-value {d.adjusted_p:.3g}",
                allowance=S.FALSE_ALARM,
            ),
        ],
        dtype="bfloat16",
        tags={"draws": S.DRAWS, "inputs": len(x), "seed": SEED},
        repro_of=lambda _: stochastic_rounding(what, x, S.DRAWS, SEED, S.FALSE_ALARM) if torchaos else None,
    )


def test_draws_differ_between_seeds_and_repeat_with_one(stochastic_rounding_under_test, amp_record):
    half = torch.tensor([float((torch.tensor([1.0]).view(torch.int32) | 0x8000).view(torch.float32))])
    a = S.draw(stochastic_rounding_under_test, half, 256, SEED)
    b = S.draw(stochastic_rounding_under_test, half, 256, SEED + 1)
    again = S.draw(stochastic_rounding_under_test, half, 256, SEED)
    both = int(torch.unique(a).numel())
    amp_record.require_all(
        [
            compare_claim(
                "sr_bf16.halfway_draws_both_neighbours",
                both,
                both == 2,
                "256 draws of an input halfway between its neighbours include both (all one: (1/2)^255)",
                detail=f"{both} distinct values drawn: the rounding is deterministic",
                expected=2,
                allowance=0,
            ),
            compare_claim(
                "sr_bf16.seeds_draw_differently",
                int((a != b).sum()),
                not torch.equal(a, b),
                "two seeds give different draws (equal by chance: (1/2)^256)",
                detail="two seeds drew the same 256 values: the randomness ignores the generator",
            ),
            compare_claim(
                "sr_bf16.one_seed_repeats",
                int((a != again).sum()),
                torch.equal(a, again),
                "the same seed gives the same draws (a training run's rounding can be replayed)",
                detail=f"{int((a != again).sum())} of 256 draws differ under the same seed",
                expected=0,
                allowance=0,
            ),
        ],
        dtype="bfloat16",
        # torchao's rounding (the default): a script can call it; a rounding of your own keeps none
        repro_of=lambda _: (
            stochastic_draws(
                "torchao's fp32 -> bf16 stochastic rounding: broken promises of randomness and replay", half, 256, SEED
            )
            if stochastic_rounding_under_test is adapters.torchao_stochastic_rounding()
            else None
        ),
    )
