"""Claim family: the training decision rules have the error rates the README states.

Each rule is run on clean recipes over many seeds (none may fail: the false-alarm rate) and on
fp32 runs with injected gradient noise of growing size (the smallest level caught in every run:
the detection limit), through :mod:`harness.domains.engines.training.rates`. A measurement of hundreds of
training runs: the thorough tier (``--amp-tier=thorough``), all three models, is what the README
quotes; ``--amp-tier=thorough -k mlp-thorough`` measures the cheapest model in about a minute.
"""

from __future__ import annotations

import pytest

from harness.domains.engines import training as T
from harness.domains.engines.training import rates
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("training parity")

#: The detection limit each rule is stated to reach (relative gradient noise caught in every run)
#: and the false-alarm rate it is stated not to exceed, from the thorough measurement in the README.
#: Parity compares AMP with fp32 against the data-order spread: it catches only gross faults. The
#: precision lane compares fp32 with fp64. The approximate golden-curve lane is measured leave-one-
#: out, a different data order judged as if it were the stored curve: its harshest case.
STATED_LIMIT = {"parity": 1.0, "precision": 2.0**-12, "golden curves (approximate lane)": 4.0}
#: Where a rule's limit differs by model, the weakest measured on any CPU kind these machines come
#: as: the precision lane on the tiny LM caught 2^-12 on the AMD kind but only 2^-8 (3.9e-3) on the
#: Intel kind (family 6 model 207), so 2^-8 is what holds on both.
STATED_LIMIT_BY_MODEL = {("precision", "tiny_lm"): 2.0**-8}
#: Fault runs of the precision lane per noise level: groups of 3 seeds judged by their median, 4
#: groups (12 seeds), so that "caught in every run" rests on more than 2 runs.
PRECISION_FAULT_SEEDS = 12
STATED_FALSE_ALARMS = {"parity": 0.0, "precision": 0.0, "golden curves (approximate lane)": 0.25}

THOROUGH = [
    pytest.param(name, 18, 6, id=f"{name}-thorough", marks=pytest.mark.amp_thorough)
    for name in ("mlp", "cnn_bn", "tiny_lm")
]


def _record(amp_record, r: rates.Rates, amp_device, stated: float | None = None, alarms: float | None = None) -> None:
    ladder = {f"{d.level:.3g}": f"{d.caught}/{d.runs}" for d in r.ladder}
    limit = r.detection_limit
    stated = STATED_LIMIT[r.rule] if stated is None else stated
    alarms = STATED_FALSE_ALARMS[r.rule] if alarms is None else alarms
    rule = r.rule.split(" ")[0].replace("golden", "golden_curves").replace("amp", "amp_lane")
    amp_record(
        f"{r.setup}.{rule}.false_alarm_rate",
        r.false_alarm_rate,
        unit="share",
        device=amp_device,
        tags={"clean_runs": r.clean_runs, "false_alarms": r.false_alarms},
        note=f"clean runs failing the {r.rule} rule",
    )
    amp_record.require(
        compare_claim(
            f"{r.setup}.{rule}.error_rates",
            limit if limit is not None else float("inf"),
            r.false_alarm_rate <= alarms and limit is not None and limit <= stated,
            f"at most {alarms:.0%} of clean runs fail the {r.rule} rule, and gradient noise of {stated:.3g} (relative) "
            "is caught in every run",
            detail=(
                f"{r.setup} / {r.rule}: {r.false_alarms} of {r.clean_runs} clean runs failed; detection limit "
                f"{limit}; caught per noise level: {ladder}",
            ),
            allowance=stated,
        ),
        device=amp_device,
        tags={"ladder": ladder, "clean_runs": r.clean_runs},
        comparable=False,  # a rate over seeded runs, recorded for the README, not a trend
    )


@pytest.mark.parametrize(("setup_name", "clean_seeds", "fault_seeds"), THOROUGH)
def test_the_parity_rule_fails_no_clean_recipe_and_catches_gross_gradient_noise(
    setup_name, clean_seeds, fault_seeds, amp_device, amp_record
):
    r = rates.parity_rates(
        T.SETUPS[setup_name], (T.BF16, T.FP16_SCALER), 8, clean_seeds, fault_seeds, device=amp_device
    )
    _record(amp_record, r, amp_device)


@pytest.mark.parametrize(("setup_name", "clean_seeds", "fault_seeds"), THOROUGH)
def test_the_fp64_precision_lane_fails_no_clean_fp32_run_and_catches_small_gradient_noise(
    setup_name, clean_seeds, fault_seeds, amp_device, amp_record
):
    r = rates.precision_rates(T.SETUPS[setup_name], clean_seeds, PRECISION_FAULT_SEEDS, device=amp_device)
    _record(amp_record, r, amp_device, stated=STATED_LIMIT_BY_MODEL.get(("precision", setup_name)))


@pytest.mark.parametrize(("setup_name", "clean_seeds", "fault_seeds"), THOROUGH)
def test_the_approximate_golden_curve_lane_fails_at_most_a_quarter_of_left_out_seeds_and_catches_gross_noise(
    setup_name, clean_seeds, fault_seeds, amp_device, amp_record
):
    r = rates.curve_rates(T.SETUPS[setup_name], clean_seeds, fault_seeds, device=amp_device)
    _record(amp_record, r, amp_device)


#: The AMP lane's clean runs per model and recipe, 30 per model over bf16 and fp16 + GradScaler:
#: 0 false alarms in 30 bounds the false-alarm rate below 10% at 95% confidence (rule of three).
LANE_CLEAN_RUNS = 15
#: The detection limit (relative gradient noise in the recipe's steps, caught in every one of the
#: 30 runs) stated per model and recipe in the README, measured by this test.
LANE_STATED = {
    ("mlp", "bf16"): 2.0**-5,
    ("mlp", "fp16+scaler"): 2.0**-8,
    ("tiny_lm", "bf16"): 2.0**-4,
    ("tiny_lm", "fp16+scaler"): 2.0**-4,
    ("cnn_bn", "bf16"): 2.0**-1,
    ("cnn_bn", "fp16+scaler"): 2.0**-1,
}
LANE_THOROUGH = [
    pytest.param(name, recipe, id=f"{name}-{recipe.name}-thorough", marks=pytest.mark.amp_thorough)
    for name in ("mlp", "cnn_bn", "tiny_lm")
    for recipe in (T.BF16, T.FP16_SCALER)
]


@pytest.mark.parametrize(("setup_name", "recipe"), LANE_THOROUGH)
def test_the_amp_lane_fails_no_clean_run_and_catches_the_stated_gradient_noise(
    setup_name, recipe, amp_device, amp_record
):
    r = rates.lane_rates(T.SETUPS[setup_name], recipe, LANE_CLEAN_RUNS, device=amp_device)
    caught = {name: f"{n}/{LANE_CLEAN_RUNS}" for name, n in r.controls_caught.items()}
    amp_record(
        f"{setup_name}.{recipe.metric_id}.amp_lane.clean_ratio_max",
        max(r.clean_ratios),
        unit="x",
        device=amp_device,
        tags={"controls_caught": caught},
        note="the largest clean ratio over the runs (the lane allows 2)",
    )
    _record(amp_record, r.rates, amp_device, stated=LANE_STATED[(setup_name, recipe.name)], alarms=0.0)
