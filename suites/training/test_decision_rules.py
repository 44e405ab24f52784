"""Claim family: the training decision rules have the error rates the README states.

Each rule is run on clean recipes over many seeds (none may fail: the false-alarm rate) and on
fp32 runs with injected gradient noise of growing size (the smallest level caught in every run:
the detection limit), through :mod:`harness.domains.training.rates`. A measurement of hundreds of
training runs: the thorough tier (``--amp-tier=thorough``), all three models, is what the README
quotes; ``--amp-tier=thorough -k mlp-thorough`` measures the cheapest model in about a minute.
"""

from __future__ import annotations

import pytest

from harness.domains import training as T
from harness.domains.training import rates
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("training parity")

#: The detection limit each rule is stated to reach (relative gradient noise caught in every run)
#: and the false-alarm rate it is stated not to exceed, from the thorough measurement in the README.
#: Parity compares AMP with fp32 against the data-order spread: it catches only gross faults. The
#: precision lane compares fp32 with fp64. The approximate golden-curve lane is measured leave-one-
#: out, a different data order judged as if it were the stored curve: its harshest case.
STATED_LIMIT = {"parity": 1.0, "precision": 2.0**-12, "golden curves (approximate lane)": 4.0}
STATED_FALSE_ALARMS = {"parity": 0.0, "precision": 0.0, "golden curves (approximate lane)": 0.25}

THOROUGH = [
    pytest.param(name, 18, 6, id=f"{name}-thorough", marks=pytest.mark.amp_thorough)
    for name in ("mlp", "cnn_bn", "tiny_lm")
]


def _record(amp_record, r: rates.Rates, amp_device) -> None:
    ladder = {f"{d.level:.3g}": f"{d.caught}/{d.runs}" for d in r.ladder}
    limit = r.detection_limit
    stated, alarms = STATED_LIMIT[r.rule], STATED_FALSE_ALARMS[r.rule]
    rule = r.rule.split(" ")[0].replace("golden", "golden_curves")
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
    r = rates.precision_rates(T.SETUPS[setup_name], clean_seeds, fault_seeds, device=amp_device)
    _record(amp_record, r, amp_device)


@pytest.mark.parametrize(("setup_name", "clean_seeds", "fault_seeds"), THOROUGH)
def test_the_approximate_golden_curve_lane_passes_every_left_out_seed_and_catches_gross_noise(
    setup_name, clean_seeds, fault_seeds, amp_device, amp_record
):
    r = rates.curve_rates(T.SETUPS[setup_name], clean_seeds, fault_seeds, device=amp_device)
    _record(amp_record, r, amp_device)
