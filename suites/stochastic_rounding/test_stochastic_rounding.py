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
        S.draws_claims(d, target, len(x), got.numel()),
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
        S.randomness_claims(r, target),
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
