"""The public names a user's tests need, in one place: ``from harness.api import Setup, BF16``.

* Training: what is trained (:class:`Setup`, batches of any structure through :class:`Inputs`),
  how a step runs (the recipes), and the decision rules as functions (parity against fp32, the AMP
  lane against a correctly rounded float64 emulation, overflow handling of your optimizer and
  scaler with a non-finite gradient element planted in your run). ``amp_training.check`` returns
  a :class:`TrainingResult` with every verdict (:class:`Checked`, by :class:`VerdictKind`), and a
  failing one raises :class:`TrainingCheckFailed` carrying the same result. In a pytest test the ``amp_training``
  fixture runs them all and records report rows; the functions are for scripts and checks of
  your own.
* Your loss scaler: :class:`ScalerAdapter` (what to implement), :func:`conformance_machine` (the
  hypothesis state machine that drives it against a versioned reference), the reference's
  exceptions, and the adapters of megatron-core and DeepSpeed.
* Your fp8 scaling code: :class:`Fp8Scaling` (what to implement: scales and casts of a 2-D tensor
  for a :class:`CastSpec`), checked bit for bit against the recipe specifications by the fp8 suite
  (return your adapter from an ``fp8_scaling_under_test`` fixture), or in a test of your own with
  :func:`check_fp8_scaling`; :class:`TorchaoScaling` is torchao's.
* Results: :func:`load_report` and :func:`find_runs` read run reports back as pandas objects;
  :class:`Outcome` is the outcome column's vocabulary; :class:`KeyKind` keys your own baselines.

Anything else under ``harness`` is internal and may change between releases.
"""

from harness.domains.fp8.adapters import Fp8Scaling, TorchaoScaling
from harness.domains.fp8.conformance import ScalingCheck, check_fp8_scaling
from harness.domains.scaling.adapters import ADAPTERS as SCALER_ADAPTERS
from harness.domains.scaling.conformance import conformance_machine
from harness.domains.scaling.reference import (
    ConfigurationDeclined,
    ScalerAdapter,
    ScalerAtMinimumError,
    ScalerConfig,
)
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
from harness.domains.training.overflow import OverflowStep
from harness.domains.training.overflow import judge as judge_overflow
from harness.domains.training.overflow import run as plant_overflows
from harness.domains.training.result import Checked, TrainingCheckFailed, TrainingResult
from harness.domains.training.result import Kind as VerdictKind
from harness.numerics.scaled import CastSpec, Granularity
from harness.numerics.verdict import Outcome
from harness.storage.baselines import KeyKind
from harness.storage.report import find_runs
from harness.storage.report import load as load_report

__all__ = [
    "ACCUM4",
    "BF16",
    "BF16_PARAMS",
    "CLIP",
    "FP16_NO_SCALER",
    "FP16_SCALER",
    "FP32",
    "LANE_FACTOR",
    "SCALER_ADAPTERS",
    "AmpLane",
    "CastSpec",
    "Checked",
    "ConfigurationDeclined",
    "Fp8Scaling",
    "Granularity",
    "Inputs",
    "KeyKind",
    "Outcome",
    "OverflowStep",
    "Recipe",
    "Run",
    "ScalerAdapter",
    "ScalerAtMinimumError",
    "ScalerConfig",
    "ScalingCheck",
    "Setup",
    "TorchaoScaling",
    "TrainingCheckFailed",
    "TrainingResult",
    "VerdictKind",
    "check_fp8_scaling",
    "check_lane",
    "check_parity",
    "conformance_machine",
    "find_runs",
    "judge_lane",
    "judge_overflow",
    "lane_steps",
    "load_report",
    "plant_overflows",
    "train",
]
