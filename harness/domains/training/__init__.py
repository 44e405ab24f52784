"""Claim family *training*: small mixed-precision training runs and the bring-your-own-model API.

The runs themselves are the training engine's (:mod:`harness.domains.engines.training`: recipes,
batches, the built-in models, the loop, the seed band, the AMP lane and its emulation, the
diagnosis); this family judges them (``check``, ``census``, ``recompute``, a user's own step in
``user_step`` and ``step_checks``) and writes failed checks as scripts (``repro``). The names
users' own tests need are re-exported here (``harness.domains.training.Setup``), no more: the
engine's other names are reached in the engine (``from harness.domains.engines import training``).
"""

from harness.domains.engines.training.loop import Run, train
from harness.domains.engines.training.models import SETUPS
from harness.domains.engines.training.parity import check_parity
from harness.domains.engines.training.recipes import (
    ACCUM4,
    BF16,
    BF16_PARAMS,
    CLIP,
    FP16_NO_SCALER,
    FP16_SCALER,
    FP32,
    Batch,
    Inputs,
    Recipe,
    Setup,
)

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "training parity"

__all__ = [
    "ACCUM4",
    "BF16",
    "BF16_PARAMS",
    "CLIP",
    "FP16_NO_SCALER",
    "FP16_SCALER",
    "FP32",
    "SETUPS",
    "Batch",
    "Inputs",
    "Recipe",
    "Run",
    "Setup",
    "check_parity",
    "train",
]
