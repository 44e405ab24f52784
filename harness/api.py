"""The public names a user's tests need, in one place: ``from harness.api import Setup, BF16``.

* Training: what is trained (:class:`Setup`, batches of any structure through :class:`Inputs`),
  how a step runs (the recipes), and the decision rules as functions (parity against fp32, the AMP
  lane against a correctly rounded float64 emulation, overflow handling of your optimizer and
  scaler with a non-finite gradient element planted in your run). ``amp_training.check`` returns
  a :class:`TrainingResult` with every verdict (:class:`Checked`, by :class:`VerdictKind`), and a
  failing one raises :class:`TrainingCheckFailed` carrying the same result. Your own training code:
  ``amp_training.check_step(build, step, recipes, batches=...)`` (the step gets a :class:`Precision`),
  or ``check_program`` with a trainer's program (:class:`HFTrainerProgram`, :class:`AccelerateProgram`,
  :class:`LightningProgram`); :func:`module_lane` judges each module of one AMP step on its own. In a pytest test the ``amp_training``
  fixture runs them all and records report rows; the functions are for scripts and checks of
  your own.
* Your loss scaler: :class:`ScalerAdapter` (what to implement), :func:`conformance_machine` (the
  hypothesis state machine that drives it against a versioned reference), the reference's
  exceptions, and the adapters of megatron-core and DeepSpeed.
* Your delayed-scaling recipe: :class:`DelayedScalingAdapter` (scale, update, history, state_dict),
  checked by :func:`delayed_scaling_machine` against the specification (:class:`DelayedConfig`;
  :class:`TorchDelayedScaling` is the harness's plain-torch one); the fp8 suite takes yours from a
  ``delayed_scaling_under_test`` fixture.
* Your fp8 scaling code: :class:`Fp8Scaling` (what to implement: scales and casts of a 2-D tensor
  for a :class:`CastSpec`), checked bit for bit against the recipe specifications by the fp8 suite
  (return your adapter from an ``fp8_scaling_under_test`` fixture), or in a test of your own with
  :func:`check_fp8_scaling`; :class:`TorchaoScaling` is torchao's.
* Your MX or NVFP4 quantiser: :class:`BlockScaling` (the bits and values of a 2-D tensor for a
  :class:`BlockSpec`, the recipes' in :data:`BLOCK_SPECS`, with :class:`BlockQuantized`), checked bit for bit by the fp8 suite (return it
  from a ``block_scaling_under_test`` fixture) or with :func:`check_block_scaling`;
  :class:`TorchaoBlockScaling` is torchao's, :class:`TorchBlockScaling` the harness's own in plain torch.
* Your block-scaled linear layer: :class:`BlockLinear` (a differentiable ``mm``; its output and
  both gradients, :class:`LinearProducts`, through :func:`block_linear_products`), judged against
  float64 with budgets from the formats (return it from a ``block_linear_under_test`` fixture, or
  use :func:`block_product_budgets` directly);
  :class:`EmulatedBlockLinear` makes one from any :class:`BlockScaling` quantiser;
  :func:`convert_to_block_scaled` swaps a model's whole-block linears for it (:class:`BlockScaledLinear`)
  to train your own model in that recipe; :func:`check_block_steps` judges that training's steps
  against the correctly rounded recipe (accuracy, and conformance up to float32);
  :class:`NVFP4RecipeLinear` is NVFP4 as NVIDIA's pretraining recipe trains it (its measures
  switched by :class:`NVFP4Recipe`), emulated in plain torch.
* Your stochastic rounding (fp32 -> bf16, or fp32 -> e2m1 as NVFP4's gradients use it):
  :func:`check_stochastic_rounding` judges support, unbiasedness (an exact binomial test), draws
  that differ and seeded replay, returning a :class:`RoundingCheck`; the fp8 suite takes yours from
  a ``stochastic_rounding_under_test`` or ``e2m1_stochastic_rounding_under_test`` fixture.
* Your data-parallel job auditing its own cards: :class:`ReplayAudit` (every N steps each rank
  replays a neighbour's micro-batch and compares the gradients bitwise; :func:`replay_audit` is one
  audit step), an :class:`AuditResult` with its :class:`AuditVerdict` naming the odd rank, raised
  as :class:`ReplayAuditFailed`; :class:`AuditLog` keeps every verdict, :func:`load_audit_log`
  reads it back.
* Checks of your own: the comparisons (``compare_claim``, ``compare_within``, ...: each a typed
  result that ``amp_record.require`` turns into one row and one assertion), :class:`Tolerance`
  and ``EXACT``, the fp8 and fp4 formats, :class:`Workload` for ``amp_speedup``.
* Results: :func:`load_report` and :func:`find_runs` read run reports back as pandas objects;
  :class:`Outcome` is the outcome column's vocabulary, :class:`RowKind` the kind column's;
  :class:`KeyKind` keys your own baselines.

Anything else under ``harness`` is internal and may change between releases.
"""

from harness.domains.autocast.repro import op_against_float64
from harness.domains.block_scaled.blocklinear import (
    BlockLinear,
    EmulatedBlockLinear,
    LinearProducts,
    TorchaoBlockLinear,
)
from harness.domains.block_scaled.blocklinear import linear_products as block_linear_products
from harness.domains.block_scaled.blocklinear import product_budgets as block_product_budgets
from harness.domains.block_scaled.blockquant import (
    BlockQuantized,
    BlockScaling,
    TorchaoBlockScaling,
    TorchBlockScaling,
    check_block_scaling,
)
from harness.domains.block_scaled.blocktraining import BlockScaledLinear, check_block_steps
from harness.domains.block_scaled.blocktraining import convert as convert_to_block_scaled
from harness.domains.block_scaled.nvfp4_recipe import NVFP4Recipe, NVFP4RecipeLinear
from harness.domains.engines.bench.workload import Workload
from harness.domains.engines.training.amp_lane import LANE_FACTOR, AmpLane, check_lane, judge_lane, lane_steps
from harness.domains.engines.training.module_lane import RegionError
from harness.domains.engines.training.module_lane import judge as judge_module_lane
from harness.domains.engines.training.module_lane import observe as module_lane
from harness.domains.engines.training.overflow import OverflowStep
from harness.domains.engines.training.overflow import judge as judge_overflow
from harness.domains.engines.training.overflow import run as plant_overflows
from harness.domains.fp8.adapters import Fp8Scaling, TorchaoScaling
from harness.domains.fp8.conformance import ScalingCheck, check_fp8_scaling
from harness.domains.fp8.delayed import DelayedConfig, DelayedScalingAdapter, TorchDelayedScaling
from harness.domains.fp8.delayed import conformance_machine as delayed_scaling_machine
from harness.domains.known_answers.replay import AuditResult, AuditVerdict, ReplayAudit, ReplayAuditFailed
from harness.domains.known_answers.replay import audit as replay_audit
from harness.domains.repro import FailureRepro
from harness.domains.scaler.adapters import ADAPTERS as SCALER_ADAPTERS
from harness.domains.scaler.adapters import semantics_of as scaler_semantics_of
from harness.domains.scaler.conformance import conformance_machine
from harness.domains.scaler.reference import (
    ConfigurationDeclined,
    Diverged,
    Divergence,
    ScalerAdapter,
    ScalerAtMinimumError,
    ScalerConfig,
)
from harness.domains.stochastic_rounding.checks import RoundingCheck, check_stochastic_rounding
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
from harness.domains.training.result import Checked, TrainingCheckFailed, TrainingResult
from harness.domains.training.result import Kind as VerdictKind
from harness.domains.training.trainers import TrainerMissing
from harness.domains.training.trainers.accelerate import AccelerateProgram
from harness.domains.training.trainers.hf import HFTrainerProgram
from harness.domains.training.trainers.lightning import LightningProgram
from harness.domains.training.user_step import Loop, Precision, Program, StepProgram
from harness.numerics.blockscaled import SPECS as BLOCK_SPECS
from harness.numerics.blockscaled import BlockSpec
from harness.numerics.comparison import (
    compare_bits,
    compare_bound,
    compare_claim,
    compare_curves,
    compare_data,
    compare_predicate,
    compare_scalar,
    compare_tensors,
    compare_values,
    compare_within,
)
from harness.numerics.formats import FP4_E2M1, FP8_E4M3FN, FP8_E5M2
from harness.numerics.scaled import CastSpec, Granularity
from harness.numerics.tolerance import EXACT, Tolerance
from harness.numerics.verdict import Outcome, RowKind
from harness.storage.audit_log import AuditLog
from harness.storage.audit_log import load as load_audit_log
from harness.storage.baselines import KeyKind
from harness.storage.report import find_runs
from harness.storage.report import load as load_report

__all__ = [
    "ACCUM4",
    "BF16",
    "BF16_PARAMS",
    "BLOCK_SPECS",
    "CLIP",
    "EXACT",
    "FP4_E2M1",
    "FP8_E4M3FN",
    "FP8_E5M2",
    "FP16_NO_SCALER",
    "FP16_SCALER",
    "FP32",
    "LANE_FACTOR",
    "SCALER_ADAPTERS",
    "AccelerateProgram",
    "AmpLane",
    "AuditLog",
    "AuditResult",
    "AuditVerdict",
    "BlockLinear",
    "BlockQuantized",
    "BlockScaledLinear",
    "BlockScaling",
    "BlockSpec",
    "CastSpec",
    "Checked",
    "ConfigurationDeclined",
    "DelayedConfig",
    "DelayedScalingAdapter",
    "Diverged",
    "Divergence",
    "EmulatedBlockLinear",
    "FailureRepro",
    "Fp8Scaling",
    "Granularity",
    "HFTrainerProgram",
    "Inputs",
    "KeyKind",
    "LightningProgram",
    "LinearProducts",
    "Loop",
    "NVFP4Recipe",
    "NVFP4RecipeLinear",
    "Outcome",
    "OverflowStep",
    "Precision",
    "Program",
    "Recipe",
    "RegionError",
    "ReplayAudit",
    "ReplayAuditFailed",
    "RoundingCheck",
    "RowKind",
    "Run",
    "ScalerAdapter",
    "ScalerAtMinimumError",
    "ScalerConfig",
    "ScalingCheck",
    "Setup",
    "StepProgram",
    "Tolerance",
    "TorchBlockScaling",
    "TorchDelayedScaling",
    "TorchaoBlockLinear",
    "TorchaoBlockScaling",
    "TorchaoScaling",
    "TrainerMissing",
    "TrainingCheckFailed",
    "TrainingResult",
    "VerdictKind",
    "Workload",
    "block_linear_products",
    "block_product_budgets",
    "check_block_scaling",
    "check_block_steps",
    "check_fp8_scaling",
    "check_lane",
    "check_parity",
    "check_stochastic_rounding",
    "compare_bits",
    "compare_bound",
    "compare_claim",
    "compare_curves",
    "compare_data",
    "compare_predicate",
    "compare_scalar",
    "compare_tensors",
    "compare_values",
    "compare_within",
    "conformance_machine",
    "convert_to_block_scaled",
    "delayed_scaling_machine",
    "find_runs",
    "judge_lane",
    "judge_module_lane",
    "judge_overflow",
    "lane_steps",
    "load_audit_log",
    "load_report",
    "module_lane",
    "op_against_float64",
    "plant_overflows",
    "replay_audit",
    "scaler_semantics_of",
    "train",
]
