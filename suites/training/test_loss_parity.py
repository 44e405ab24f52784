"""Claim family: a model trained with AMP on this stack learns the same as in fp32, and the
source text's failure modes (no loss scaling, no fp32 master weights, low-precision gradient
accumulation) measurably break that.

The allowance is measured, not guessed: the seed-to-seed spread of fp32 runs (data order) of the
evaluation loss at each checkpoint; an AMP recipe must stay within PARITY_FRACTION of it, and a
negative control must exceed it by CONTROL_FACTOR somewhere.
"""

from __future__ import annotations

import pytest

from harness.domains import training as T

PARITY_CASES = [
    ("mlp", T.BF16),
    ("mlp", T.FP16_SCALER),
    ("mlp", T.ACCUM4),
    ("mlp", T.CLIP),
    ("mlp", T.FP16_WITH_SCALER_SMALL),
    ("mlp", T.FP16_STATIC_FP32_ACCUM),
    ("mlp", T.BF16_GRAD_ACCUM),
    ("tiny_lm", T.BF16),
    ("tiny_lm", T.FP16_SCALER),
    ("cnn_bn", T.BF16),
    ("cnn_bn", T.FP16_SCALER),
]
CONTROLS = [("mlp", T.FP16_NO_SCALER), ("mlp", T.FP16_GRAD_ACCUM), ("mlp_small_lr", T.BF16_PARAMS)]


def _ids(case: tuple[str, T.Recipe]) -> str:
    return f"{case[0]}-{case[1].name}".replace(" ", "_")


def _check(setup_name, recipe, fp32_runs, amp_device):
    setup = T.SETUPS[setup_name]
    return T.check_parity(setup, [recipe], device=amp_device, fp32_runs=fp32_runs(setup)).results[0]


def _record(amp_record, setup_name, r, allowance_factor, outcome, amp_device):
    for t, d, a in zip(r.parity.steps, r.parity.diffs, r.parity.allowances, strict=True):
        amp_record(
            f"{setup_name}.{r.recipe.name}.eval_loss_diff",
            d,
            expected=0.0,
            allowance=a * allowance_factor,
            device=amp_device,
            dtype=str(r.recipe.dtype or "float32"),
            outcome="info",
            tags={"step": t},
        )
    amp_record(
        f"{setup_name}.{r.recipe.name}.worst_diff_over_allowance",
        r.parity.worst,
        allowance=1.0,
        device=amp_device,
        dtype=str(r.recipe.dtype or "float32"),
        outcome=outcome,
        tags={
            "skipped_steps": r.run.skipped_at,
            "zero_grad_share": r.run.zero_grad_share,
            "final_loss": r.run.losses[-1],
            "fp32_final_loss": r.reference.losses[-1],
        },
        note=f"|L_amp - L_fp32| at eval checkpoints over {T.PARITY_FRACTION} x seed band",
    )


@pytest.mark.parametrize("case", PARITY_CASES, ids=_ids)
def test_amp_recipe_matches_fp32_well_inside_the_seed_spread(case, fp32_runs, amp_device, amp_record):
    setup_name, recipe = case
    r = _check(setup_name, recipe, fp32_runs, amp_device)
    _record(amp_record, setup_name, r, 1.0, "pass" if r.parity.passed else "fail", amp_device)
    assert r.parity.passed, "\n".join(
        [
            f"{setup_name} / {recipe.name}: eval loss moved more than {T.PARITY_FRACTION} x the fp32 seed spread "
            f"(skipped steps replayed on the reference: {r.run.skipped_at}):"
        ]
        + [
            f"  step {t}: |diff| {d:.4g} > allowance {a:.4g}"
            for t, d, a in zip(r.parity.steps, r.parity.diffs, r.parity.allowances, strict=True)
            if d > a
        ]
    )


@pytest.mark.parametrize("case", CONTROLS, ids=_ids)
def test_negative_control_misses_parity_by_a_clear_margin(case, fp32_runs, amp_device, amp_record):
    setup_name, recipe = case
    r = _check(setup_name, recipe, fp32_runs, amp_device)
    clear = r.parity.worst >= T.CONTROL_FACTOR
    _record(amp_record, setup_name, r, 1.0, "pass" if clear else "fail", amp_device)
    amp_record(
        f"{setup_name}.{recipe.name}.zero_gradient_share",
        r.run.zero_grad_share,
        unit="share",
        device=amp_device,
        note="share of gradient values exactly zero at the optimizer step",
    )
    assert clear, (
        f"negative control {recipe.name!r} stayed within {r.parity.worst:.3g} x the parity allowance (needs >= "
        f"{T.CONTROL_FACTOR}): the suite is not sensitive enough to tell this broken recipe from seed noise"
    )


DETERMINISM = [
    ("mlp", T.FP32),
    ("mlp", T.BF16),
    ("mlp", T.FP16_SCALER),
    ("tiny_lm", T.FP32),
    ("tiny_lm", T.BF16),
    ("cnn_bn", T.FP32),
    ("cnn_bn", T.BF16),
]


@pytest.mark.parametrize("case", DETERMINISM, ids=_ids)
def test_the_same_recipe_run_twice_gives_bitwise_identical_losses(case, amp_device, amp_record):
    import torch

    setup_name, recipe = case
    if amp_device.type == "cuda":
        torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        same, first = T.is_deterministic(T.SETUPS[setup_name], recipe, amp_device)
    finally:
        if amp_device.type == "cuda":
            torch.use_deterministic_algorithms(False)
    amp_record(f"{setup_name}.{recipe.name}.deterministic", same, outcome="pass" if same else "fail", device=amp_device)
    assert same, (
        f"nondeterministic: {setup_name} / {recipe.name} gave different losses from step {first} on a rerun (not a regression: fix determinism first)"
    )
