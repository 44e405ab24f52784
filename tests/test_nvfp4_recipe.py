"""The emulated NVFP4 pretraining recipe's parts (harness/domains/block_scaled/nvfp4_recipe.py): the
Hadamard rotation leaves the exact weight gradient unchanged, 16x16 tiles give forward and backward
one weight, stochastic rounding to e2m1 is unbiased by an exact binomial test (and a rounding
secretly to nearest, or biased by a tenth of a step, fails it), and the recipe's training check
can fail (scales one binade high leave the band)."""

from __future__ import annotations

import pytest
import torch

from harness.domains.block_scaled.blocktraining import block_recipe, block_setup, parity_fraction
from harness.domains.block_scaled.nvfp4_recipe import NVFP4Recipe, NVFP4RecipeLinear
from harness.domains.engines.training import FP32, SETUPS, seed_band, train
from harness.domains.engines.training.parity import parity
from harness.domains.stochastic_rounding import checks as S
from harness.numerics import blockscaled as B
from harness.numerics.formats import FP4_E2M1
from harness.numerics.rounding import round_to_format, stochastic_round_to_format


def _unbiased(rounding) -> tuple[bool, float]:
    """Support and the exact binomial test of :mod:`harness.domains.stochastic_rounding.checks` on e2m1 (its
    inputs and reference neighbours; ``rounding`` draws from torch's generator)."""
    x = S.e2m1_inputs()
    d = S.judge_draws(x, S.draw(rounding, x, S.DRAWS, 1000), S.E2M1)
    return d.on_support and d.unbiased, d.adjusted_p


def test_stochastic_rounding_to_e2m1_draws_neighbours_unbiased():
    passed, adjusted = _unbiased(lambda x: stochastic_round_to_format(x.double(), FP4_E2M1, torch.default_generator))
    assert passed, f"smallest Bonferroni-adjusted p-value {adjusted:.3g} < {S.FALSE_ALARM:g}"


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(lambda x: round_to_format(x.double(), FP4_E2M1), id="secretly-to-nearest"),
        pytest.param(
            lambda x: stochastic_round_to_format(
                x.double() + torch.sign(x.double()) * 0.05, FP4_E2M1, torch.default_generator
            ),
            id="biased-tenth-of-a-step",
        ),
    ],
)
def test_a_broken_stochastic_rounding_fails_the_same_test(broken):
    assert not _unbiased(broken)[0]


def test_the_hadamard_rotation_leaves_the_exact_weight_gradient_unchanged():
    lin = NVFP4RecipeLinear()
    g = torch.Generator().manual_seed(0)
    gt, xt = (
        torch.randn(32, 64, generator=g, dtype=torch.float64),
        torch.randn(48, 64, generator=g, dtype=torch.float64),
    )
    rotated = lin.rotate(gt) @ lin.rotate(xt).T
    assert torch.allclose(rotated, gt @ xt.T, rtol=0, atol=1e-12 * float((gt @ xt.T).abs().max()))
    assert not torch.equal(lin.rotate(gt), gt)  # and it does rotate


def test_weight_tiles_give_forward_and_backward_one_weight():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    along_in, along_out = NVFP4RecipeLinear().weight(w)
    assert along_in is along_out
    plain_in, plain_out = NVFP4RecipeLinear(NVFP4Recipe(weight_tiles=False)).weight(w)
    assert not torch.equal(plain_in, plain_out)  # 1x16 blocks read the weight two ways


class _BinadeHigh(NVFP4RecipeLinear):
    """The recipe with every cast decoding at twice its value (its block scales one binade high)."""

    def cast(self, a: torch.Tensor, spec_id: str, stochastic: bool = False) -> torch.Tensor:
        return super().cast(a, spec_id, stochastic) * 2


def test_the_recipes_training_check_fails_with_scales_one_binade_high():
    setup = SETUPS["mlp"]
    fp = [train(setup, FP32, k) for k in range(5)]
    band = seed_band(fp)
    fraction = parity_fraction(B.SPECS["nvfp4"])
    clean = train(block_setup(setup, "nvfp4", NVFP4RecipeLinear()), block_recipe("nvfp4"), 0)
    broken = train(block_setup(setup, "nvfp4", _BinadeHigh()), block_recipe("nvfp4"), 0)
    assert parity(clean, fp[0], band, fraction).passed
    assert not parity(broken, fp[0], band, fraction).passed
