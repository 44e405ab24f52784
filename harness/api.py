"""The public names a user's tests need, in one place: ``from harness.api import Setup, BF16``.

What is trained (:class:`Setup`, batches of any structure through :class:`Inputs`), how a step runs
(the recipes), and the decision rules as functions (parity against fp32, the AMP lane against a
correctly rounded float64 emulation). In a pytest test, the ``amp_training`` fixture runs them all
and records report rows; these functions are for scripts and for checks of your own.
"""

from harness.domains.training import (
    ACCUM4,
    BF16,
    BF16_PARAMS,
    CLIP,
    FP16_NO_SCALER,
    FP16_SCALER,
    FP32,
    Inputs,
    Recipe,
    Run,
    Setup,
    check_parity,
    train,
)
from harness.domains.training.amp_lane import LANE_FACTOR, AmpLane, check_lane, judge_lane, lane_steps

__all__ = [
    "ACCUM4",
    "BF16",
    "BF16_PARAMS",
    "CLIP",
    "FP16_NO_SCALER",
    "FP16_SCALER",
    "FP32",
    "LANE_FACTOR",
    "AmpLane",
    "Inputs",
    "Recipe",
    "Run",
    "Setup",
    "check_lane",
    "check_parity",
    "judge_lane",
    "lane_steps",
    "train",
]
