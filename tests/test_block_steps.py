"""The block-scaled training steps' two rules on one MLP run, without an inner pytest run: a clean
recipe passes both, block scales one binade high fail both, e5m2 gradients fail only conformance.
(The suite's own wiring of them is controlled in test_fp8_suite_can_fail.py.)"""

from __future__ import annotations

import math

import pytest
import torch
from faults.block_scaled import E5m2GradientsLinear, LinearOverBinadeHighScales

from harness.domains.block_scaled.blocklinear import TorchaoBlockLinear
from harness.domains.block_scaled.blocktraining import (
    block_lane,
    block_lane_reference,
    block_recipe,
    block_setup,
    check_block_steps,
    judge_conformance,
    step_conformance,
)
from harness.domains.engines.training import amp_lane as L
from harness.domains.training import SETUPS, train
from harness.numerics.formats import FP4_E2M1, FP8_E4M3FN
from harness.numerics.rounding import round_to_format

pytest.importorskip("torchao", reason="the block-scaled linear under test is torchao's (pip install amp-harness[fp8])")

SPEC = "mxfp8-rceil"


@pytest.fixture(scope="module")
def clean_run():
    setup = SETUPS["mlp"]
    linear = TorchaoBlockLinear()
    run = train(block_setup(setup, SPEC, linear), block_recipe(SPEC), 0, keep_states_at=L.lane_steps(setup))
    return setup, linear, run, block_lane_reference(setup, SPEC, run)


def _verdicts(clean_run, linear):
    setup, _, run, ref = clean_run
    lane, _ = block_lane(setup, SPEC, linear, run, ref)
    return L.judge_lane(lane).passed, judge_conformance(step_conformance(setup, SPEC, linear, run, ref)).passed


def test_a_clean_recipe_passes_both_step_rules(clean_run):
    assert _verdicts(clean_run, clean_run[1]) == (True, True)


def test_scales_one_binade_high_fail_both_step_rules(clean_run):
    assert _verdicts(clean_run, LinearOverBinadeHighScales()) == (False, False)


def test_e5m2_gradients_fail_only_the_conformance_rule(clean_run):
    assert _verdicts(clean_run, E5m2GradientsLinear()) == (True, False)


def test_a_run_that_leaves_finite_arithmetic_fails_both_rules():
    """NVFP4 over scales one binade high diverges to NaN by step 40: those checkpoints count as
    infinitely wrong steps, not as steps left out."""
    accurate, conforms = check_block_steps(SETUPS["mlp"], "nvfp4", LinearOverBinadeHighScales())
    assert not accurate.passed and not conforms.passed
    assert math.isinf(conforms.value) and "the run's state is not finite" in conforms.explain()


@pytest.mark.parametrize("fmt", [FP8_E4M3FN, FP4_E2M1], ids=lambda f: f.short)
def test_the_arithmetic_rounding_meets_every_code_and_midpoint(fmt):
    """round_to_format (the harness's quantiser never casts) against the format's own code table:
    every value stays, every midpoint goes to the even neighbour, beyond the maximum saturates."""
    values = sorted({abs(x) for c in range(1 << fmt.total_bits) if not math.isnan(x := fmt.decode(c))})
    v = torch.tensor(values, dtype=torch.float64)
    assert torch.equal(round_to_format(v, fmt), v) and torch.equal(round_to_format(-v, fmt), -v)
    mids = (v[1:] + v[:-1]) / 2
    got = round_to_format(mids, fmt)
    even = [values[i] if (fmt.round_bits(values[i]).bits or 0) % 2 == 0 else values[i + 1] for i in range(len(mids))]
    assert got.tolist() == even
    assert round_to_format(torch.tensor([fmt.max * 4, -math.inf]), fmt).tolist() == [fmt.max, -fmt.max]
