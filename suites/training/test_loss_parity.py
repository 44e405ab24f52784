"""Claim family: a model trained with AMP on this stack learns the same as in fp32, and the
source text's failure modes (no loss scaling, no fp32 master weights, low-precision gradient
accumulation) measurably break that.

The allowance is measured, not guessed: the seed-to-seed spread of fp32 runs (data order) of the
evaluation loss at each checkpoint; an AMP recipe must stay within PARITY_FRACTION of it, and a
negative control must exceed it by CONTROL_FACTOR somewhere.

Parity only sees gross faults (its detection limit is in the README), so every case is also judged
by the AMP lane: each training step of the recipe, taken again from the run's own state, may be at
most LANE_FACTOR (one significand bit) less accurate against float64 than the same step correctly
rounded to the format and emulated in float64; a negative control must exceed it. The lane's power
on these models is shown by the negative controls themselves (``power=False``).
"""

from __future__ import annotations

import pytest

from harness.domains.engines import training as T
from harness.domains.training import repro as training_repro

pytestmark = pytest.mark.amp_capability("training parity")

PARITY_CASES = [
    ("mlp", T.BF16),
    ("mlp", T.FP16_SCALER),
    ("mlp", T.ACCUM4),
    ("mlp", T.CLIP),
    ("mlp", T.FP16_WITH_SCALER_SMALL),
    ("mlp", T.FP16_STATIC_FP32_ACCUM),
    ("mlp", T.BF16_GRAD_ACCUM),
    # where bf16 is emulated (AVX2-only kernels) the LM's bf16 run and AMP lane are the suite's
    # largest cost: thorough there, where the mlp and the cnn_bn judge bf16 parity by default
    pytest.param(("tiny_lm", T.BF16), marks=pytest.mark.amp_thorough_where_emulated("bf16")),
    # fp16 is emulated on CPUs without avx512_fp16 or AMX-FP16, and the LM's fp16 run and AMP lane
    # are then its largest cost: thorough there (docs/running.md); fp16+scaler is judged by
    # default on the mlp (two gradient scales) and the cnn_bn, the LM by bf16
    pytest.param(("tiny_lm", T.FP16_SCALER), marks=pytest.mark.amp_thorough_where_emulated("fp16")),
    ("cnn_bn", T.BF16),
    ("cnn_bn", T.FP16_SCALER),
]
CONTROLS = [("mlp", T.FP16_NO_SCALER), ("mlp", T.FP16_GRAD_ACCUM), ("mlp_small_lr", T.BF16_PARAMS)]


def _ids(case: tuple[str, T.Recipe]) -> str:
    return f"{case[0]}-{case[1].name}".replace(" ", "_")


def _check(setup_name, recipe, fp32_runs, amp_device, train_cached=None):
    setup = T.SETUPS[setup_name]
    report = T.check_parity(setup, [recipe], device=amp_device, fp32_runs=fp32_runs(setup))
    if train_cached is not None:  # the determinism check's first run (seed 0, the same recipe)
        train_cached.remember(setup, recipe, 0, amp_device, report.results[0].run)
    return report


def _record(amp_record, amp_training, setup_name, report, amp_device):
    """The per-checkpoint distances (information), then the recipe's parity verdict (a failure is
    diagnosed down to the module where the AMP run departs) and its AMP lane verdict."""
    r, band = report.results[0], report.band
    dtype = str(r.recipe.dtype or "float32")
    for t, d, a in zip(r.parity.steps, r.parity.diffs, r.parity.allowances, strict=True):
        amp_record(
            f"{setup_name}.{r.recipe.metric_id}.eval_loss_diff",
            d,
            expected=0.0,
            allowance=a,
            device=amp_device,
            dtype=dtype,
            tags={"step": t},
        )
    failures = [
        failure
        for failure in (
            amp_training.parity_verdict(
                T.SETUPS[setup_name],
                r,
                band,
                tags={
                    "zero_grad_share": r.run.zero_grad_share,
                    "final_loss": r.run.losses[-1],
                    "fp32_final_loss": r.reference.losses[-1],
                },
            ),
            *amp_training.lane_verdicts(T.SETUPS[setup_name], report, power=False),
        )
        if failure is not None
    ]
    assert not failures, "\n".join(failures)  # verdict recorded


@pytest.mark.parametrize("case", PARITY_CASES, ids=_ids)
def test_amp_recipe_matches_fp32_well_inside_the_seed_spread(
    case, fp32_runs, amp_device, amp_record, amp_training, train_cached
):
    setup_name, recipe = case
    checked = _check(setup_name, recipe, fp32_runs, amp_device, train_cached)
    _record(amp_record, amp_training, setup_name, checked, amp_device)


@pytest.mark.parametrize("case", CONTROLS, ids=_ids)
def test_negative_control_misses_parity_by_a_clear_margin(case, fp32_runs, amp_device, amp_record, amp_training):
    setup_name, recipe = case
    checked = _check(setup_name, recipe, fp32_runs, amp_device)
    r = checked.results[0]
    amp_record(
        f"{setup_name}.{recipe.metric_id}.zero_gradient_share",
        r.run.zero_grad_share,
        unit="share",
        device=amp_device,
        note="share of gradient values exactly zero at the optimizer step",
    )
    _record(amp_record, amp_training, setup_name, checked, amp_device)


DETERMINISM = [
    ("mlp", T.FP32),
    ("mlp", T.BF16),
    ("mlp", T.FP16_SCALER),
    ("tiny_lm", T.FP32),
    pytest.param(("tiny_lm", T.BF16), marks=pytest.mark.amp_thorough_where_emulated("bf16")),  # as its parity
    ("cnn_bn", T.FP32),
    ("cnn_bn", T.BF16),
]


@pytest.mark.parametrize("case", DETERMINISM, ids=_ids)
def test_the_same_recipe_run_twice_gives_bitwise_identical_losses(case, amp_device, amp_record, train_cached):
    """The second run is made here; the first is the session's run of the same recipe and seed
    where another check already made one (fp32's band, the parity check), else made here too."""
    import torch

    setup_name, recipe = case
    setup = T.SETUPS[setup_name]
    earlier = train_cached.get(setup, recipe, 0, amp_device) if amp_device.type == "cpu" else None
    if amp_device.type == "cuda":
        torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        same, first = T.is_deterministic(setup, recipe, amp_device, first=earlier)
    finally:
        if amp_device.type == "cuda":
            torch.use_deterministic_algorithms(False)
    script = None if same else training_repro.determinism_repro_of(setup, recipe, amp_device)
    amp_record.require(T.judge_determinism(setup_name, recipe, same, first), device=amp_device, repro=script)
