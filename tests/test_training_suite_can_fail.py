"""Negative controls: injected training regressions make the parity and golden-curve checks fail."""

from __future__ import annotations

import json

import pytest
from helpers import INNER_ARGS, inject

PARITY = "training/test_loss_parity.py"
CURVES = "training/test_golden_curves.py"


def _setup(pytester, suite_copy, *files):
    suite_copy(*files)  # with the suite's conftest: the run cache and seeds fixtures


@pytest.mark.parametrize(
    ("target", "factory", "case"),
    [
        ("torch.amp.GradScaler.step", "scaler_step_flushing_small_gradients", "mlp-fp16+scaler]"),
        ("torch.nn.functional.linear", "autocast_linear_dropping_bias", "mlp-bf16]"),
        ("torch.amp.GradScaler.step", "scaler_silently_skipping_every_third_step", "cnn_bn-fp16+scaler]"),
    ],
)
def test_a_training_regression_fails_parity(pytester, suite_copy, target, factory, case):
    _setup(pytester, suite_copy, PARITY)
    inject(pytester, "", patches={target: f"faults.training.{factory}"})  # above the suite's conftest, which stays
    result = pytester.runpytest(*INNER_ARGS, "-k", f"well_inside and {case}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*eval loss moved more than 0.5 x the fp32 seed spread*", "*step *: |diff| * > allowance *"], consecutive=False
    )


def test_a_drifted_golden_curve_fails_naming_the_steps(pytester, suite_copy):
    _setup(pytester, suite_copy, CURVES)
    pytester.runpytest(*INNER_ARGS, "-k", "mlp")  # writes the golden curves
    [path] = (pytester.path / "baselines" / "training").glob("*/loss_curves_mlp.json")
    doc = json.loads(path.read_text())
    curve = doc["data"]["curves"]["bf16"]
    doc["data"]["curves"]["bf16"] = [
        v + 0.5 if 10 <= t < 20 else v for t, v in enumerate(curve)
    ]  # a regression over 10 steps
    path.write_text(json.dumps(doc))
    result = pytester.runpytest(*INNER_ARGS, "-k", "mlp")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*golden loss curves mlp: FAILED: * of * values differ (allowance: per-step allowance: the fp32 seed spread*",
            "*bf16[[]1?]: expected *, got * (|diff|=0.5 > allowance *)*",
        ],
        consecutive=False,
    )


def test_isolated_outlier_steps_are_tolerated(pytester, suite_copy):
    _setup(pytester, suite_copy, CURVES)
    pytester.runpytest(*INNER_ARGS, "-k", "mlp")
    [path] = (pytester.path / "baselines" / "training").glob("*/loss_curves_mlp.json")
    doc = json.loads(path.read_text())
    doc["data"]["curves"]["bf16"][30] += 0.5  # one spike
    path.write_text(json.dumps(doc))
    pytester.runpytest(*INNER_ARGS, "-k", "mlp").assert_outcomes(passed=1)


def test_a_profile_without_curves_is_judged_against_another_profiles_curves(pytester, suite_copy):
    """The reference lane: a hardware profile with no golden curves of its own is compared with
    another profile's within the seed-spread allowance, says which, and writes nothing."""
    _setup(pytester, suite_copy, CURVES)
    pytester.runpytest(*INNER_ARGS, "-k", "mlp and not small")  # writes the detected profile's curves
    other = [*INNER_ARGS, "-k", "mlp and not small", "--amp-profile=cpu-avx2", "-rA"]
    pytester.runpytest(*other).assert_outcomes(passed=1)
    assert not (pytester.path / "baselines" / "training" / "cpu-avx2").exists()
    [path] = (pytester.path / "baselines" / "training").glob("*/loss_curves_mlp.json")
    doc = json.loads(path.read_text())
    doc["data"]["curves"]["bf16"] = [
        v + 0.5 if 10 <= t < 20 else v for t, v in enumerate(doc["data"]["curves"]["bf16"])
    ]
    path.write_text(json.dumps(doc))
    result = pytester.runpytest(*other)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*golden loss curves mlp (reference lane: *loss_curves_mlp.json): FAILED*"], consecutive=False
    )
