"""Claim family: stochastic rounding is what it promises, judged statistically, into bf16 and e2m1.

Every draw is one of the input's two neighbours in the format; the share of draws away from zero is
the exact probability the input gives (unbiased), within a binomial test whose designed false-alarm
rate is 1e-6 per run (exact binomial p-values, Bonferroni over the inputs); an input halfway between
its neighbours draws both, two seeds draw differently, one seed draws the same
(``harness/domains/stochastic_rounding/checks.py``). Into bf16 the rounding is torchao's (its optimizers',
``stochastic_rounding_under_test``); into e2m1, NVFP4's gradients, the harness's own emulation by
default (``e2m1_stochastic_rounding_under_test``: your kernel's element rounding), where a kernel
returning zeros is the failure one GPU generation shipped (NVIDIA/TransformerEngine PR 3281).
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.stochastic_rounding import checks as S
from harness.domains.stochastic_rounding import roundings
from harness.domains.stochastic_rounding.repro import stochastic_draws, stochastic_rounding
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("stochastic rounding")

SEED = 20261202

#: Each target format and the fixture that gives the rounding under test.
UNDER_TEST = {"bf16": "stochastic_rounding_under_test", "e2m1": "e2m1_stochastic_rounding_under_test"}
TARGETS = [pytest.param(S.TARGETS[name], id=name) for name in UNDER_TEST]


def _under_test(request: pytest.FixtureRequest, target: S.Target) -> tuple[S.Rounding, bool]:
    """The rounding under test for ``target``, and whether it is torchao's bf16 rounding (which a
    failure's script can call; a rounding of your own or the harness's keeps none)."""
    rounding = request.getfixturevalue(UNDER_TEST[target.name])
    return rounding, target is S.BF16 and rounding is roundings.torchao_stochastic_rounding()


@pytest.mark.parametrize("target", TARGETS)
def test_every_draw_is_a_neighbour_and_the_draws_are_unbiased(request, target, amp_record):
    rounding, torchaos = _under_test(request, target)
    x = target.inputs()
    got = S.draw(rounding, x, S.DRAWS, SEED)
    d = S.judge_draws(x, got, target)
    what = "torchao's fp32 -> bf16 stochastic rounding: draws off the neighbours, or counts not Binomial(n, p)"
    amp_record.require_all(
        [
            compare_claim(
                f"sr_{target.name}.off_support_draws",
                d.off_support,
                d.on_support,
                f"every draw is the input's {target.name} neighbour toward or away from zero (from {target.reference})",
                detail=f"{d.off_support} of {got.numel()} draws were neither neighbour",
                expected=0,
                allowance=0,
                unit="draws",
            ),
            compare_claim(
                f"sr_{target.name}.smallest_adjusted_p_value",
                d.adjusted_p,
                d.unbiased,
                f"over {S.DRAWS} draws of each of {len(x)} inputs, the count away from zero is Binomial(n, p) with p "
                f"from {target.reference}: every exact two-sided p-value x {len(x)} (Bonferroni) >= "
                f"{S.FALSE_ALARM:g} (a correct rounding fails once in 1e6 runs; a probability bias of "
                f"{S.detectable_bias(len(x)):.3g} of a step is caught with 99% power)",
                detail=f"input {d.worst_input!r}: {d.away} of {S.DRAWS} draws away from zero, {d.expected_away:.4g} "
                f"expected; adjusted p-value {d.adjusted_p:.3g}",
                allowance=S.FALSE_ALARM,
            ),
        ],
        dtype=target.dtype,
        tags={"draws": S.DRAWS, "inputs": len(x), "seed": SEED},
        repro_of=lambda _: stochastic_rounding(what, x, S.DRAWS, SEED, S.FALSE_ALARM) if torchaos else None,
    )


@pytest.mark.parametrize("target", TARGETS)
def test_draws_differ_between_seeds_and_repeat_with_one(request, target, amp_record):
    rounding, torchaos = _under_test(request, target)
    r = S.judge_randomness(rounding, target, SEED)
    n = S.HALFWAY_DRAWS
    amp_record.require_all(
        [
            compare_claim(
                f"sr_{target.name}.halfway_draws_both_neighbours",
                r.distinct,
                r.draws_both,
                f"{n} draws of {target.halfway!r}, halfway between its neighbours, include both (all one: "
                f"(1/2)^{n - 1})",
                detail=f"{r.distinct} distinct values drawn: the rounding is deterministic",
                expected=2,
                allowance=0,
            ),
            compare_claim(
                f"sr_{target.name}.seeds_draw_differently",
                r.differing_between_seeds,
                r.seeds_differ,
                f"two seeds give different draws (equal by chance: (1/2)^{n})",
                detail="two seeds drew the same 256 values: the randomness ignores the generator",
            ),
            compare_claim(
                f"sr_{target.name}.one_seed_repeats",
                r.differing_on_replay,
                r.repeats,
                "the same seed gives the same draws (a training run's rounding can be replayed)",
                detail=f"{r.differing_on_replay} of {n} draws differ under the same seed",
                expected=0,
                allowance=0,
            ),
        ],
        dtype=target.dtype,
        repro_of=lambda _: (
            stochastic_draws(
                "torchao's fp32 -> bf16 stochastic rounding: broken promises of randomness and replay",
                torch.tensor([target.halfway], dtype=torch.float32),
                n,
                SEED,
            )
            if torchaos
            else None
        ),
    )
