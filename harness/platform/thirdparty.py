"""The one way the harness imports the third-party libraries whose numerics it checks (torchao,
megatron-core, DeepSpeed): quietly, since what they warn about on import (CUDA-only extensions that
did not load on a CPU host) is their environment, not what a suite checks; and their versions."""

from __future__ import annotations

import importlib
import warnings
from importlib.metadata import version
from types import ModuleType

import torch

#: The torchao release CI pairs with its torch (constraints/cpu.txt), named when torchao is missing.
TORCHAO_TESTED = "0.18.0"


def import_third_party(name: str) -> ModuleType:
    """Import a third-party module (``torchao.float8.config``, ``deepspeed.runtime...``) with the
    warnings its import emits silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def import_first_of(*names: str) -> ModuleType:
    """The first of ``names`` that imports (a module a library moved between releases: torchao's
    MX linear is ``prototype.mx_formats.mx_linear`` in 0.17, ``prototype.moe_training.mxfp8_linear``
    in 0.18), or the last one's ImportError."""
    for name in names[:-1]:
        try:
            return import_third_party(name)
        except ImportError:
            pass
    return import_third_party(names[-1])


def version_of(package: str) -> str:
    """The installed release of a distribution (``megatron-core``, ``deepspeed``, ``torchao``)."""
    return version(package)


def torchao_missing() -> str | None:
    """Why the fp8 suite cannot use torchao here, or None when it can."""
    try:
        module = import_third_party("torchao")
    except ImportError as e:
        return f"torchao is not installed ({e}); install it with `pip install amp-harness[fp8]` (tested: torchao {TORCHAO_TESTED})"
    except Exception as e:  # a torchao built for another torch fails in its own ways
        return f"torchao failed to import with this torch {torch.__version__}: {type(e).__name__}: {e}"
    if not hasattr(module, "float8"):
        return f"torchao {getattr(module, '__version__', '?')} has no torchao.float8 (tested: {TORCHAO_TESTED})"
    return None


def torchao_version() -> str:
    return str(getattr(import_third_party("torchao"), "__version__", "unknown"))
