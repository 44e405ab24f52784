"""A training run as a standalone script: the built-in model's source, its initial weights and
the run's batches saved beside the script, trained under the recipe (autocast, micro-batches,
clipping, a loss factor, a static loss scale, micro-batch gradient buffers of their own dtype,
GradScaler with any overflow injected inside the forward pass), eagerly or through
``torch.compile``. The run is the engine's, so the script is too: the training family judges it
against fp32, a golden curve or float64 (``harness.domains.training.repro``), the compiled family
against eager (:func:`repro_of` with a backend); each picks its judgement block of
``scripts/whole_run.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.engines.training.parity import PARITY_FRACTION, Band
from harness.domains.engines.training.recipes import DATA_SEED_OFFSET, EVAL_SEED, INIT_SEED, Recipe, Setup
from harness.domains.engines.training.sources import model_source, unsupported
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src

#: the whole run, standalone: ``scripts/whole_run.py``
WHOLE_RUN = ScriptTemplate(__package__ or "harness.domains.engines.training", "whole_run")


@dataclass(frozen=True)
class Trainer:
    """A run's model and inputs (blocks of :data:`WHOLE_RUN` replaced), its values, and the tensors
    saved beside the script."""

    replace: dict[str, str]
    values: dict[str, str]
    tensors: dict[str, torch.Tensor]

    def code(self, judgement: str, **values: str) -> str:
        """The script's code: the trainer, then ``judgement``'s block with ``values``."""
        blocks = ("model", "inputs", "parameters", "trainer", judgement)
        return WHOLE_RUN.fill(*blocks, values={**self.values, **values}, replace=self.replace)


def repro_of(
    setup: Setup,
    recipe: Recipe,
    band: Band,
    device: torch.device,
    *,
    backend: Any = None,
    overflow: frozenset[int] = frozenset(),
) -> FailureRepro | None:
    """The whole run against fp32, and, compiled with ``backend`` (a name; a backend function of
    your own has no script), against eager too (None: see
    :func:`unsupported`, or a model or loss whose source cannot be read, or batches that are not
    two tensors)."""

    allowed = {t: PARITY_FRACTION * band.per_step[t] for t in sorted(band.per_step)}
    trainer = trainer_of(setup, recipe, device, backend, overflow, sorted(allowed))
    if trainer is None:
        return None
    # half the fp32 seed band per checkpoint
    code = trainer.code("parity", LOW=dtype_src(recipe.dtype), ALLOWED=repr(allowed))
    what = (
        f"{setup.name} trained {setup.steps} steps under {recipe.name} with the model compiled ({backend}): "
        "eval losses against eager AMP and fp32, and the GradScaler's state against eager"
        if backend is not None
        else f"{setup.name} trained {setup.steps} steps under {recipe.name}: eval losses against fp32"
    )
    return FailureRepro(
        "compiled" if backend is not None else "training",
        what,
        code,
        f"{PARITY_FRACTION} x the fp32 seed band (median pairwise distance of {band.seeds} seeds' eval losses), "
        "measured by the check" + ("; the scaler's state exactly" if backend is not None else ""),
        trainer.tensors,
        device=str(device),
    )


def eager_trainer(setup: Setup, recipe: Recipe, device: torch.device) -> Trainer | None:
    """The eager run's trainer (:func:`trainer_of`, no checkpoints)."""
    return trainer_of(setup, recipe, device, None, frozenset(), [])


def trainer_of(
    setup: Setup,
    recipe: Recipe,
    device: torch.device,
    backend: Any,
    overflow: frozenset[int],
    checkpoints: list[int],
    seeds: int = 1,
) -> Trainer | None:
    """The script's model, data (the batches of data orders ``0..seeds-1``) and
    ``train(dtype, compiled, skip, seed)`` -> (eval losses at ``checkpoints``, the scaler's (scales,
    skipped steps, final scale), per-step training losses); ``dtype`` float64: the problem in
    float64, as the precision lane trains it. None where the run cannot stand alone."""
    if unsupported(setup, recipe, backend) is not None:
        return None
    source = model_source(setup)
    orders = []
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
        orders.append([setup.batch(step, gen) for step in range(setup.steps)])
    eval_batch = setup.batch(0, torch.Generator().manual_seed(EVAL_SEED))
    if source is None:
        return None
    if not all(isinstance(t, torch.Tensor) for batches in orders for b in (*batches, eval_batch) for t in b):
        return None
    weights = setup.model(INIT_SEED).state_dict()
    names = list(weights)
    tensors: dict[str, torch.Tensor] = {f"w{i}": weights[k].detach().clone() for i, k in enumerate(names)}
    for seed, batches in enumerate(orders):
        tensors[f"xs{seed}"] = torch.stack([b[0] for b in batches])
        tensors[f"ys{seed}"] = torch.stack([b[1] for b in batches])
    tensors.update(ex=eval_batch[0], ey=eval_batch[1])
    if setup.optimizer not in ("sgd", "adamw", "adam"):
        return None
    values = {
        "MODEL": setup.model.__name__,
        "INIT_SEED": repr(INIT_SEED),
        "DEVICE": repr(device.type),
        "BACKEND": repr(backend),
        "STEPS": repr(setup.steps),
        "LR": repr(setup.lr),
        "WD": repr(setup.weight_decay),
        "OPTIMIZER": repr(setup.optimizer),
        "SCALER": repr(recipe.scaler),
        "OVERFLOW": repr(sorted(overflow)),
        "CHECKPOINTS": repr(checkpoints),
        "MICRO": repr(recipe.micro_batches),
        "CLIP": repr(recipe.clip),
        "LOSS_FACTOR": repr(recipe.loss_factor),
        "STATIC": repr(recipe.static_scale),
        "ACCUM": dtype_src(recipe.grad_accum_dtype),
        "BATCHES": f"[{', '.join(f'(xs{s}, ys{s})' for s in range(seeds))}]",
    }
    weights_src = f"WEIGHTS = dict(zip({names!r}, [{', '.join(f'w{i}' for i in range(len(names)))}]))"
    return Trainer({"model": source, "inputs": weights_src}, values, tensors)
