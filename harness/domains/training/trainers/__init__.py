"""The trainers people use, as :class:`~harness.domains.training.user_step.Program` objects: the
trainer runs its own loop with its own AMP (autocast, scaler, scheduler), and the harness watches
from a callback. Each imports its package only when it runs (extras ``amp-harness[hf]``,
``[accelerate]``, ``[lightning]``); :func:`require` names the extra when it is missing."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

#: package -> the extra that installs it
EXTRAS = {"transformers": "hf", "accelerate": "accelerate", "lightning": "lightning"}


class TrainerMissing(ImportError):
    """The trainer's package is not installed: the message names the extra to install."""


def available(package: str) -> bool:
    """Whether ``package`` can be imported here (without importing it)."""
    return importlib.util.find_spec(package) is not None


def require(package: str) -> ModuleType:
    """``package``, imported; a :class:`TrainerMissing` naming its extra where it is not installed."""
    if not available(package):
        extra = EXTRAS.get(package, package)
        raise TrainerMissing(f"{package} is not installed: pip install 'amp-harness[{extra}]'")
    return importlib.import_module(package)
