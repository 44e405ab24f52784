"""Claim family: the per-step loss curves of each recipe are the golden curves of this hardware
profile, and fp32 itself has not lost precision.

Two lanes judge the curves (Megatron's functional tests keep the same two):

- **deterministic**: the stored curves were made on this hardware class with this software stack
  (torch, CUDA): training is bitwise reproducible there (the suite's determinism checks), so every
  step must be bitwise equal, no outliers.
- **approximate**: the curves come from another class or stack (or from another profile, when
  this one has none): each step within the per-step fp32 seed spread, with the outlier steps a
  clean curve needs at a false-alarm rate of CURVE_FALSE_ALARM (derived in
  ``harness.domains.training.outlier_allowance``).

Beside the stored curves, the **precision lane** (``harness.domains.engines.training.precision``): fp32
against an fp64 run of the same recipe, within 2^-8 of bf16 autocast's distance from it. It needs
no stored curves, so a precision regression shared by fp32 and AMP fails on a stack whose goldens
are new.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.engines import training as T
from harness.domains.engines.training.precision import (
    PRECISION_FRACTION,
    PRECISION_SEEDS,
    judge_precision,
    precision_lane,
)
from harness.domains.training import repro as training_repro
from harness.numerics.comparison import compare_curves
from harness.platform.hardware import computing_class
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("training parity")

CURVES = {"mlp": [T.BF16, T.FP16_SCALER], "tiny_lm": [T.BF16, T.FP16_SCALER], "cnn_bn": [T.BF16, T.FP16_SCALER]}


def _lane_key(amp_hardware_class) -> dict[str, str | None]:
    """What the deterministic lane requires to be unchanged: hardware class, with the threads torch
    computed on (an xdist worker's share differs from a serial run's), and software stack."""
    return {
        "hardware_class": computing_class(amp_hardware_class.hardware_class),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def _curve_script(setup, comparison, stored_curves, allowance, max_outliers, max_run, lane, device):
    """The first changed curve's run as a script (the built-in models; None where it cannot stand
    alone): its per-step losses against the stored ones, by the lane's rule."""
    changed = [d.path.partition("[")[0] for d in comparison.differences]
    recipes = {"fp32": T.FP32, **{r.name: r for r in CURVES[setup.name]}}
    name = next((c for c in changed if c in recipes and c in stored_curves), None)
    if name is None:
        return None
    return training_repro.curve_repro_of(
        setup, recipes[name], list(stored_curves[name]), list(allowance[name]), max_outliers, max_run, lane, device
    )


#: The LM's curves train its fp32 band and three recipes (about 4 s on 2 cores): thorough-tier; the
#: MLP and the CNN judge the claim in the default tier.
CURVE_SETUPS = [pytest.param(n, marks=pytest.mark.amp_thorough) if n == "tiny_lm" else n for n in sorted(CURVES)]


@pytest.mark.parametrize("setup_name", CURVE_SETUPS)
def test_loss_curves_match_the_golden_curves_of_this_profile(
    setup_name, fp32_runs, train_cached, amp_device, amp_record, amp_baseline, amp_hardware_class
):
    setup = T.SETUPS[setup_name]
    fp = fp32_runs(setup)
    runs = {"fp32": fp[0], **{r.name: train_cached(setup, r, 0, amp_device) for r in CURVES[setup_name]}}
    curves = {name: run.losses for name, run in runs.items()}
    band = T.per_step_spread(fp)
    outliers = T.outlier_allowance(setup.steps, len(fp))
    amp_record(
        f"{setup_name}.seed_band.mean",
        sum(band) / len(band),
        unit="loss",
        device=amp_device,
        tags={"seeds": len(fp), "outlier_steps_allowed": outliers.steps, "outlier_run_allowed": outliers.longest_run},
        note="per-step training-loss spread of fp32 seeds: the approximate lane's allowance",
    )
    for name, curve in curves.items():
        amp_record(f"{setup_name}.{name}.final_loss", curve[-1], device=amp_device)
    allowance = dict.fromkeys(curves, band)
    exact = dict.fromkeys(curves, [0.0] * setup.steps)
    approximate = (
        f"approximate lane: per-step allowance the fp32 seed spread ({len(fp)} seeds) at that step, outlier steps "
        f"derived for a false-alarm rate {T.CURVE_FALSE_ALARM} over {setup.steps} steps"
    )
    key = _lane_key(amp_hardware_class)
    reference = amp_baseline.reference(f"loss_curves_{setup_name}", key=KeyKind.PROFILE, device=str(amp_device))
    if reference is not None:
        # No curves of this profile's own: the approximate lane, against another profile's curves
        path, stored = reference
        origin = f"{approximate}; this profile has no curves of its own (record them with --amp-regen)"
        judged = compare_curves(
            f"golden loss curves {setup_name} (approximate lane, another profile's curves: {path})",
            stored["curves"],
            curves,
            allowance,
            outliers.steps,
            origin,
            outliers.longest_run,
        )
        script = None
        if not judged.passed:
            script = _curve_script(
                setup, judged, stored["curves"], allowance, outliers.steps, outliers.longest_run, origin, amp_device
            )
        amp_record.require(judged, device=amp_device, tags={"lane": "approximate", "reference": path}, repro=script)
        return
    lane: dict[str, object] = {}

    def judge(stored, got):
        if stored.get("lane_key") == key:
            lane.update(lane="deterministic")
            return compare_curves(
                f"golden loss curves {setup_name} (deterministic lane: {key['hardware_class']}, torch {key['torch']})",
                stored["curves"],
                got["curves"],
                exact,
                0,
                "deterministic lane: same hardware class and software stack as the stored curves, so bitwise equal",
            )
        lane.update(lane="approximate", stored_on=stored.get("lane_key"))
        return compare_curves(
            f"golden loss curves {setup_name} (approximate lane: stored on {stored.get('lane_key') or 'an unrecorded stack'})",
            stored["curves"],
            got["curves"],
            allowance,
            outliers.steps,
            approximate,
            outliers.longest_run,
        )

    amp_baseline.check(
        f"loss_curves_{setup_name}",
        {"curves": curves, "seed_band": band, "lane_key": key},
        key=KeyKind.PROFILE,
        device=str(amp_device),
        comparator=judge,
        tags=lane,
        repro=lambda changed, stored: _curve_script(
            setup,
            changed,
            stored["curves"],
            exact if lane.get("lane") == "deterministic" else allowance,
            0 if lane.get("lane") == "deterministic" else outliers.steps,
            None if lane.get("lane") == "deterministic" else outliers.longest_run,
            "deterministic lane: the same hardware class and software stack, so bitwise equal"
            if lane.get("lane") == "deterministic"
            else approximate,
            amp_device,
        ),
    )


#: The precision lane's models: the LM's three fp64 runs (about 1 s each here) are thorough-tier.
PRECISION = [
    pytest.param("cnn_bn"),
    pytest.param("mlp"),
    pytest.param("tiny_lm", marks=pytest.mark.amp_thorough),
]


@pytest.mark.parametrize("setup_name", PRECISION)
def test_fp32_stays_within_rounding_distance_of_an_fp64_run(setup_name, train_cached, amp_device, amp_record):
    setup = T.SETUPS[setup_name]
    lanes = [
        precision_lane(
            setup,
            seed,
            amp_device,
            fp32_run=train_cached(setup, T.FP32, seed, amp_device),
            low_run=train_cached(setup, T.BF16, seed, amp_device),
        )
        for seed in range(PRECISION_SEEDS)
    ]
    for lane in lanes:
        amp_record(
            f"{setup_name}.fp32_distance_from_fp64",
            lane.d32,
            unit="loss",
            device=amp_device,
            tags={"seed": lane.seed, "per_checkpoint": lane.fp32_distance, "bf16_per_checkpoint": lane.low_distance},
        )
    verdict = judge_precision(lanes)
    amp_record.require(
        verdict,
        device=amp_device,
        tags={"lane": "precision", "ratios": [x.ratio for x in lanes]},
        # a failure keeps the runs as a script: fp32, bf16 and float64 for each data order
        repro=None
        if verdict.passed
        else training_repro.precision_repro_of(
            setup, T.BF16, PRECISION_SEEDS, PRECISION_FRACTION, "sqrt(u_fp32 / u_bf16) = 2^-8", amp_device
        ),
    )
