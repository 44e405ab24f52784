"""A built-in model as script text: its source, its loss, and one step of it as a standalone script.

The training family's failed checks, the memory family's scripts and the speed family's LM step
all write a built-in model out through here; a model of the user's own cannot be (its imports and
constants are code a script cannot carry), and :func:`unsupported` says which runs can.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

import torch

from harness.domains.engines.training.recipes import FP32, INIT_SEED, Recipe, Setup
from harness.domains.repro import ScriptTemplate


def _sources(fn: Callable[..., Any]) -> str | None:
    """``fn``'s source and that of the classes and functions of its module it reaches (a model's
    modules), dependencies first; None where some source cannot be read."""
    module = inspect.getmodule(fn)
    if module is None:
        return None
    parts: list[str] = []
    seen: set[int] = set()
    todo: list[Any] = [fn]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            src = textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError):
            return None
        parts.append(src.rstrip())
        for name in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", src)):
            v = getattr(module, name, None)
            if (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == module.__name__:
                todo.append(v)
    return "\n\n\n".join(reversed(parts))


def _loss_source(loss: Callable[..., Any]) -> str | None:
    """``LOSS``: a ``torch.nn.functional`` loss by name, else its source renamed."""
    if getattr(loss, "__module__", None) == "torch.nn.functional":
        return f"LOSS = F.{loss.__name__}"
    src = _sources(loss)
    return None if src is None else f"{src}\n\n\nLOSS = {loss.__name__}"


#: one step of a model, standalone: ``scripts/one_step.py``
ONE_STEP = ScriptTemplate(__package__ or "harness.domains.engines.training", "one_step")


#: where the built-in models live: a model of yours needs your code (imports, constants) a script
#: cannot carry
BUILT_IN = "harness.domains.engines.training.models"


def unsupported(setup: Setup, recipe: Recipe, backend: Any = None) -> str | None:
    """Why no script can reproduce this run standalone, or None (``backend``: the compile
    backend of a compiled run)."""
    if backend is not None and not isinstance(backend, str):
        return "a backend function of your own"
    if getattr(setup.model, "__module__", None) != BUILT_IN:
        return "a model of your own"
    if not isinstance(setup.optimizer, str) or setup.schedule is not None or setup.scaler is not None:
        return "an optimizer factory, schedule or scaler of the setup's own"
    if any(v is not None for v in (recipe.emulate, recipe.params_dtype, recipe.grad_noise)):
        return f"recipe {recipe.name}: an emulation, low-precision parameters or injected gradient noise"
    # a subclass's own forward (by name: the harness's modules may have been imported twice)
    own_forward = any("forward" in vars(k) for k in type(setup).__mro__ if k.__name__ != Setup.__name__)
    if setup.loss is None or own_forward:
        return "a model's own loss or forward"
    return None


def model_source(setup: Setup) -> str | None:
    """The script's model classes and ``LOSS`` (None where a source cannot be read)."""
    model_src, loss_src = _sources(setup.model), _loss_source(setup.loss) if setup.loss else None
    if model_src is None or loss_src is None:
        return None
    return f"{model_src}\n\n\n{loss_src}"


def model_prelude(
    setup: Setup, weights: dict[str, torch.Tensor], batch: tuple[Any, Any], device: torch.device
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """A script's opening for one step of a built-in model: its source, ``model_at()`` (the model
    with ``weights``, saved beside the script, on the device) and ``loss_of(model, low)`` (the loss
    of the batch ``x, y`` under autocast to ``low``; None: fp32). None: see :func:`unsupported`, a
    source that cannot be read, or a batch that is not two tensors."""

    source = model_source(setup)
    if unsupported(setup, FP32) is not None or source is None:
        return None
    if not all(isinstance(t, torch.Tensor) for t in batch):
        return None
    names = list(weights)
    tensors = {f"w{i}": weights[k].detach().clone() for i, k in enumerate(names)}
    tensors.update(x=batch[0], y=batch[1])
    weights_src = f"WEIGHTS = dict(zip({names!r}, [{', '.join(f'w{i}' for i in range(len(names)))}]))"
    values = {"MODEL": setup.model.__name__, "INIT_SEED": repr(INIT_SEED), "DEVICE": repr(device.type)}
    blocks = ("model", "inputs", "parameters", "opening")
    return ONE_STEP.fill(*blocks, values=values, replace={"model": source, "inputs": weights_src}), tensors
