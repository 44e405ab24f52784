"""Claim family: training with block-scaled (MXFP8, MXFP4, NVFP4) linears stays near fp32, and
each of its steps is the recipe's correctly rounded step.

The training suite's loop and comparison (evaluation loss at every checkpoint against the fp32
seed band), with the block-scaled linear under test (``block_linear_under_test``: torchao's MX
linear, NVFP4 emulated over torchao's quantiser; or yours) in every linear whose features are whole
blocks. The allowance is float8's measured rule scaled by the element format's unit roundoff
(``harness/domains/block_scaled/blocktraining.py``). Each run's loss gap is recorded in units of the band and
against bf16 autocast's gap on the same seed: the envelope of each recipe.

The band sees only gross faults; the AMP lane judges steps. From the run's kept states, each next
step is taken again by the linear under test, in float64, and by the recipe correctly rounded (the
harness's own quantiser, checked against the exact reference in test_block_scaling.py, with float64
products). Two claims: the step is as accurate as the correctly rounded one (the AMP lane's rule:
at most the error of one element bit fewer), and it *is* that step up to float32 evaluation (at
most twice as far from it as the specification's own float32 evaluation).
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.domains.block_scaled.blocktraining import (
    block_lane,
    block_lane_reference,
    block_linear_over_budget,
    block_recipe,
    block_setup,
    converted,
    first_block_linear_over_budget,
    judge_conformance,
    parity_fraction,
    step_conformance,
)
from harness.domains.block_scaled.nvfp4_recipe import NVFP4RecipeLinear
from harness.domains.engines.scaled.band import judge_band
from harness.domains.engines.scaled.localise import first_failed_step, localised_row
from harness.domains.engines.training import BF16, SETUPS, seed_band
from harness.domains.engines.training.amp_lane import judge_lane, lane_steps
from harness.domains.engines.training.parity import RecipeResult, conclusive, parity
from harness.numerics import blockscaled as B
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("block scaling")

#: fp32 seeds of each band (the training suite's cheap-model count)
SEEDS = 5

#: torchao's MXFP8 training default and NVFP4 by default; the others in the thorough tier
RECIPES = [
    s if s in ("mxfp8-rceil", "nvfp4") else pytest.param(s, marks=pytest.mark.amp_thorough)
    for s in ("mxfp8-rceil", "mxfp8-floor", "mxfp4-rceil", "nvfp4")
]


def _skip_unsupported(spec_id: str, linear) -> None:
    reason = linear.unsupported(B.SPECS[spec_id])
    if reason is not None:
        pytest.skip(f"{linear.name} cannot run {spec_id} here: {reason}")


def _block_run(setup_name: str, spec_id: str, linear, train_cached, device):
    """Seed 0 of the block-scaled recipe, its lane states kept: one run for the band and the lane."""
    setup = SETUPS[setup_name]
    return train_cached(
        block_setup(setup, spec_id, linear), block_recipe(spec_id), 0, device, keep_states_at=lane_steps(setup)
    )


def _judge(
    setup_name: str, spec_id: str, linear, train_cached, device, amp_record, label: str = "", select: str = ""
) -> None:
    """``label``: the recipe's name in the rows where it is not the cast's (default ``spec_id``);
    ``select``: what ``pytest -k`` selects the test by, besides the setup (default ``spec_id``)."""
    label = label or spec_id
    spec = B.SPECS[spec_id]
    _skip_unsupported(spec_id, linear)
    setup = SETUPS[setup_name]
    names, total = converted(setup, spec_id)
    amp_record.require(
        compare_claim(
            f"{setup_name}.{label}.linears_converted",
            len(names),
            bool(names),
            f"at least one of the {total} linears has whole {spec.block[1]}-element blocks (otherwise the run is fp32)",
            detail=f"{setup_name}: no linear's features are multiples of {spec.block[1]}: the check would be vacuous",
            expected=total,
            allowance=total - 1,
            inconclusive=True,
        ),
        device=device,
        tags={"converted": ", ".join(names)},
    )
    fp = train_cached.fp32(setup, SEEDS, device)
    band = seed_band(fp)
    bf16_gap = parity(train_cached(setup, BF16, 0, device), fp[0], band, 1.0).worst
    run = _block_run(setup_name, spec_id, linear, train_cached, device)
    fraction = parity_fraction(spec)
    p = parity(run, fp[0], band, fraction)
    vacuous = conclusive(setup_name, RecipeResult(block_recipe(spec_id), run, fp[0], p))
    if vacuous is not None:
        amp_record.require(vacuous, device=device)
    gap = p.worst * fraction
    tags = {"implementation": linear.name, "converted": f"{len(names)} of {total}", "seed": 0}
    amp_record(f"{setup_name}.{label}.worst_gap_in_bands", gap, device=device, tags=tags, note="fp32 seed bands")
    amp_record(
        f"{setup_name}.{label}.gap_over_bf16s",
        gap / bf16_gap if bf16_gap > 0 else float("inf"),
        device=device,
        tags={**tags, "bf16_gap_in_bands": round(bf16_gap, 4)},
        note="the recipe's worst loss gap to fp32 over bf16 autocast's on the same seed: a finding",
    )
    verdict = judge_band(
        f"{setup_name}.{label}.worst_diff_over_allowance",
        p,
        f"|L_{label} - L_fp32| at every evaluation checkpoint <= {fraction:g} x the fp32 seed band "
        f"(median pairwise distance of {band.seeds} seeds; float8's rule x u_elem / u_e4m3)",
        f"{setup_name} / {label} ({linear.name})",
        f"pytest suites/block_scaled/test_block_training.py -k '{setup_name} and {select or spec_id}'",
    )
    if not verdict.passed:  # the first block-scaled linear over its budget at the first failed checkpoint
        line = localised_row(
            amp_record,
            f"{setup_name}.{label}",
            first_failed_step(p),
            lambda: first_block_linear_over_budget(setup, spec_id, linear, first_failed_step(p), device),
            device,
            tags,
        )
        verdict = dataclasses.replace(verdict, detail=(*verdict.detail, line))
    amp_record.require(verdict, device=device, tags=tags)


@pytest.mark.parametrize("spec_id", RECIPES)
def test_block_scaled_mlp_training_stays_within_its_band(
    spec_id, block_linear_under_test, train_cached, amp_device, amp_record
):
    """The MLP: its 64x64 hidden linear has whole MX blocks, and its 16x64 input linear NVFP4's."""
    _judge("mlp", spec_id, block_linear_under_test, train_cached, amp_device, amp_record)


@pytest.mark.amp_thorough  # an fp32 band of the LM and 9 block-scaled linears per step
@pytest.mark.parametrize("spec_id", ["mxfp8-rceil", "nvfp4"])
def test_block_scaled_lm_training_stays_within_its_band(
    spec_id, block_linear_under_test, train_cached, amp_device, amp_record
):
    """The tiny LM, every linear block-scaled (widths 128-512, 256 tokens a batch). MXFP8 with
    FLOOR scales does not meet the rule here (2.1 bands median over 3 seeds, docs/fp8.md) and MXFP4
    comes within 0.6 band of its allowance: both are measured findings, not judged."""
    _judge("tiny_lm", spec_id, block_linear_under_test, train_cached, amp_device, amp_record)


@pytest.mark.parametrize("setup_name", ["mlp", pytest.param("tiny_lm", marks=pytest.mark.amp_thorough)])
def test_nvfp4_with_the_pretraining_recipes_measures_stays_within_its_band(
    setup_name, train_cached, amp_device, amp_record
):
    """NVFP4 as NVIDIA's pretraining recipe trains (16x16 weight tiles, stochastically rounded
    gradients, a random Hadamard transform on the weight gradient's inputs), emulated on the
    harness's quantiser (torchao's are Triton kernels for SM100+ GPUs): within NVFP4's band, its gap recorded."""
    _judge(
        setup_name,
        "nvfp4",
        NVFP4RecipeLinear(),
        train_cached,
        amp_device,
        amp_record,
        label="nvfp4-recipe",
        select="pretraining",
    )


#: (setup, recipe) of the step claims: the MLP's default recipes by default, the LM's thorough
STEPS = [
    ("mlp", "mxfp8-rceil"),
    ("mlp", "nvfp4"),
    *(pytest.param("tiny_lm", s, marks=pytest.mark.amp_thorough) for s in ("mxfp8-rceil", "nvfp4")),
]


def _lane(setup_name, spec_id, linear, train_cached, block_lane_references, device):
    """The run, the lane of ``linear`` and its reference (made once per run: both step claims use it)."""
    _skip_unsupported(spec_id, linear)
    setup = SETUPS[setup_name]
    run = _block_run(setup_name, spec_id, linear, train_cached, device)
    key = (setup_name, spec_id, id(run))
    if key not in block_lane_references:
        block_lane_references[key] = block_lane_reference(setup, spec_id, run, device)
    lane, reference = block_lane(setup, spec_id, linear, run, block_lane_references[key], device)
    return setup, run, lane, reference


@pytest.mark.parametrize(("setup_name", "spec_id"), STEPS)
def test_block_scaled_steps_are_as_accurate_as_correctly_rounded_ones(
    setup_name, spec_id, block_linear_under_test, train_cached, block_lane_references, amp_device, amp_record
):
    """The AMP lane's rule: from each checkpoint, the step's error against float64 is at most twice
    (one element significand bit fewer) the correctly rounded block-scaled step's."""
    setup, run, lane, _ = _lane(
        setup_name, spec_id, block_linear_under_test, train_cached, block_lane_references, amp_device
    )
    tags = {"implementation": block_linear_under_test.name, "seed": 0}
    verdict = judge_lane(lane)
    if not verdict.passed:
        worst = max(lane.errors, key=lambda e: e.ratio).step
        verdict = _localised(verdict, setup, spec_id, block_linear_under_test, run, worst, amp_device, amp_record, tags)
    amp_record.require(verdict, device=amp_device, tags=tags)


def _localised(verdict, setup, spec_id, linear, run, step, device, amp_record, tags):
    """A failed step claim with the first block-scaled linear over its budget in the step taken
    from the run's kept state ``step`` (a row keeping its script), as a line of its detail."""
    state = run.states.get(step)
    if state is None:
        return verdict
    line = localised_row(
        amp_record,
        f"{setup.name}.{spec_id}.step_{step + 1}",
        step,
        lambda: block_linear_over_budget(setup, spec_id, linear, state.model, state.next_batch, device),
        device,
        tags,
    )
    return dataclasses.replace(verdict, detail=(*verdict.detail, line))


@pytest.mark.parametrize(("setup_name", "spec_id"), STEPS)
def test_block_scaled_steps_are_the_specifications_up_to_float32(
    setup_name, spec_id, block_linear_under_test, train_cached, block_lane_references, amp_device, amp_record
):
    """From each checkpoint, the step lies from the correctly rounded one no further than twice
    what float32 evaluation of the specification itself moves it: scales, casts and products are
    the recipe's. Sees what the lane's accuracy rule cannot: a format slip in the gradients alone."""
    setup, run, _, reference = _lane(
        setup_name, spec_id, block_linear_under_test, train_cached, block_lane_references, amp_device
    )
    c = step_conformance(setup, spec_id, block_linear_under_test, run, reference, amp_device)
    rerun = (
        f"seed 0, pytest suites/block_scaled/test_block_training.py -k '{setup_name} and {spec_id} and specification'"
    )
    tags = {"implementation": block_linear_under_test.name, "seed": 0}
    verdict = judge_conformance(c, rerun)
    if not verdict.passed:
        worst = c.steps[max(range(len(c.steps)), key=lambda i: c.ratios[i])]
        verdict = _localised(verdict, setup, spec_id, block_linear_under_test, run, worst, amp_device, amp_record, tags)
    amp_record.require(verdict, device=amp_device, tags=tags)
