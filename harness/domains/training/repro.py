"""A failed claim about a whole training run as a standalone script: the run itself.

Where no single op of a step leaves its budget (the op localiser's script), where Inductor fuses
the ops a dispatch mode would see (compiled training), where a run left its golden curve, or where
fp32 drifted from float64, the smallest faithful script is the run itself: the built-in model's
source, its initial weights and the run's batches saved beside the script, trained under the
recipe (autocast, micro-batches, clipping, a loss factor, a static loss scale, micro-batch
gradients summed in buffers of their own dtype, GradScaler with any overflow injected inside the
forward pass), eagerly or through ``torch.compile`` and then also eagerly, and in fp32 (or
float64) as the reference, or against the stored curve. The allowance is the check's: half the
fp32 seed band at each checkpoint, or the golden-curve lane's rule, measured seed-to-seed spreads
written into the script with their origin (re-deriving them would mean training every seed).
A failed AMP lane judges steps, not the run: its script is those steps, each from the run's
state saved beside it, taken by the recipe, in float64 and correctly rounded (the lane's
emulation written out), against the lane's factor. The gradient census's scaler claim is one
GradScaler step from the census's state.
Your own models, emulated recipes (the harness's float64 rounding mode), setups with a
schedule, an optimizer factory or a scaler of their own, and compile backend functions keep no
script: the script would need code it cannot carry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from harness.domains.engines.training import whole_run as W
from harness.domains.engines.training.amp_lane import FP16_HEADROOM, LANE_FACTOR, MAX_BACKOFF, lane_dtype
from harness.domains.engines.training.loop import Run
from harness.domains.engines.training.recipes import INIT_SEED, Recipe, Setup
from harness.domains.engines.training.sources import ONE_STEP, model_prelude, model_source, unsupported
from harness.domains.engines.training.whole_run import repro_of as repro_of
from harness.domains.op_prints import OpPrint
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src, upcast_src
from harness.domains.training.census import census_state
from harness.numerics.formats import format_of


def curve_repro_of(
    setup: Setup,
    recipe: Recipe,
    stored: list[float],
    allowance: list[float],
    max_outliers: int,
    max_run: int | None,
    lane: str,
    device: torch.device,
) -> FailureRepro | None:
    """The whole run's per-step training losses against a stored golden curve: each step within its
    allowance (0: bitwise), up to ``max_outliers`` steps excepted, at most ``max_run`` in a row."""

    eager = W.eager_trainer(setup, recipe, device)
    if eager is None:
        return None
    code = eager.code(
        "curve",
        DTYPE=dtype_src(recipe.dtype),
        STORED=repr(stored),
        ALLOWANCE=repr(allowance),
        MAX_OUTLIERS=repr(max_outliers),
        MAX_RUN=repr(max_run),
    )
    return FailureRepro(
        "training",
        f"{setup.name} trained {setup.steps} steps under {recipe.name}: per-step training losses against its golden "
        "curve",
        code,
        lane,
        eager.tensors,
        device=str(device),
    )


def determinism_repro_of(setup: Setup, recipe: Recipe, device: torch.device) -> FailureRepro | None:
    """The run made twice in one process, as the determinism check makes it: every step's training
    loss bitwise the same (a NaN equal to a NaN); on CUDA with deterministic algorithms, as there."""

    eager = W.eager_trainer(setup, recipe, device)
    if eager is None:
        return None
    code = eager.code("determinism", DTYPE=dtype_src(recipe.dtype))
    return FailureRepro(
        "training",
        f"{setup.name} trained {setup.steps} steps under {recipe.name} twice: per-step training losses bitwise equal",
        code,
        "0: a rerun of the same seed gives bitwise-identical losses (determinism, not a tolerance)",
        eager.tensors,
        device=str(device),
    )


def precision_repro_of(
    setup: Setup, recipe: Recipe, seeds: int, fraction: float, origin: str, device: torch.device
) -> FailureRepro | None:
    """fp32 against a float64 run of the same problem, per data order, against ``recipe``'s
    (bf16 autocast's) distance from it: the median ratio over ``seeds`` orders at most ``fraction``."""

    checkpoints = setup.checkpoints()
    trainer = W.trainer_of(setup, recipe, device, None, frozenset(), checkpoints, seeds)
    if trainer is None:
        return None
    low = str(recipe.dtype).removeprefix("torch.")
    code = trainer.code("precision", LOW=dtype_src(recipe.dtype), FRACTION=repr(fraction))
    return FailureRepro(
        "training",
        f"{setup.name}: fp32's distance from a float64 run of the same training, against {low} autocast's, median "
        f"over {seeds} data orders",
        code,
        origin,
        trainer.tensors,
        device=str(device),
    )


#: The AMP lane's judged steps, standalone: ``scripts/lane.py`` (held to
#: :func:`harness.domains.engines.training.loop.step_from` and the emulation bit for bit by
#: tests/test_whole_run_scripts.py)
LANE = ScriptTemplate(__package__ or "harness.domains.training", "lane")


def _state_keys(optimizer: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """An optimizer state_dict's keys per parameter, each None (a tensor, saved beside the script)
    or its literal value: the script's ``OPT_KEYS``."""
    return {
        i: {k: None if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
        for i, entry in optimizer["state"].items()
    }


def lane_repro_of(
    setup: Setup, recipe: Recipe, run: Run, steps: list[int], device: torch.device
) -> FailureRepro | None:
    """The AMP lane from the states ``run`` kept at ``steps`` (the checkpoints the lane judged): each
    state saved beside the script, the next step taken by the recipe, in float64 and correctly
    rounded in float64, the median ratio of their errors against ``LANE_FACTOR`` (None: see
    :func:`unsupported`, or a model whose source cannot be read, or batches that are not two tensors)."""

    dtype = lane_dtype(recipe)
    source = model_source(setup)
    if dtype is None or unsupported(setup, recipe) is not None or source is None or not steps:
        return None
    optimizer = type(setup.make_optimizer(list(setup.model(INIT_SEED).parameters()), setup.lr))
    if getattr(torch.optim, optimizer.__name__, None) is not optimizer:
        return None
    tensors: dict[str, torch.Tensor] = {}
    first = run.states[steps[0]]
    names, groups = list(first.model), first.optimizer["param_groups"]
    keys = _state_keys(first.optimizer)
    for t in steps:
        state = run.states[t]
        batch = state.next_batch
        two_tensors = isinstance(batch, tuple | list) and len(batch) == 2
        if not (two_tensors and all(isinstance(b, torch.Tensor) for b in batch)):
            return None
        same_shape = _state_keys(state.optimizer) == keys
        if list(state.model) != names or state.optimizer["param_groups"] != groups or not same_shape:
            return None  # a state of another shape (a schedule, a late-created moment): not written out
        tensors.update({f"m{t}_{i}": state.model[k] for i, k in enumerate(names)})
        for i, entry in state.optimizer["state"].items():
            tensors.update({f"o{t}_{i}_{k}": v for k, v in entry.items() if isinstance(v, torch.Tensor)})
        tensors[f"x{t}"], tensors[f"y{t}"] = batch[0], batch[1]
    low = str(dtype).removeprefix("torch.")
    values = {
        "MODEL": setup.model.__name__,
        "INIT_SEED": repr(INIT_SEED),
        "OPTIMIZER": f"torch.optim.{optimizer.__name__}",
        "DEVICE": repr(device.type),
        "LOW": dtype_src(dtype),
        "SCALER": repr(recipe.scaler),
        "MICRO": repr(recipe.micro_batches),
        "CLIP": repr(recipe.clip),
        "LOSS_FACTOR": repr(recipe.loss_factor),
        "STATIC": repr(recipe.static_scale),
        "ACCUM": dtype_src(recipe.grad_accum_dtype),
        "NAMES": repr(names),
        "OPT_KEYS": repr(keys),
        "SCALES": "{" + ", ".join(f"{t}: {run.states[t].scale!r}" for t in steps) + "}",
        "GROUPS": repr(groups),
        "LANE_FACTOR": repr(LANE_FACTOR),
        "FP16_HEADROOM": repr(FP16_HEADROOM),
        "MAX_BACKOFF": repr(MAX_BACKOFF),
    }
    code = LANE.fill("model", "parameters", "states", "steps", values=values, replace={"model": source})
    return FailureRepro(
        "training",
        f"{setup.name} under {recipe.name}: the next training step from each judged state of the run, its error "
        f"against the float64 step over that of the step correctly rounded to {low} (median over {len(steps)} states)",
        code,
        f"LANE_FACTOR = {LANE_FACTOR:g}: the error of a correctly rounded step is proportional to the format's unit "
        "roundoff, so 2 is that of one significand bit fewer",
        tensors,
        device=str(device),
    )


def census_skip_repro_of(setup: Setup, scale: float, seed: int, device: torch.device) -> FailureRepro | None:
    """The gradient census's scaler claim: from the census's state (saved beside the script), the
    fp32 gradients scaled by ``scale`` overflow fp16, so torch's GradScaler at ``scale`` must skip
    the step and back off (None: see :func:`unsupported`, or a source that cannot be read)."""

    at = census_state(setup, seed, device=device)  # the state the check stepped from
    prelude = model_prelude(setup, at.model.state_dict(), (at.inputs, at.targets), device)
    if prelude is None:
        return None
    opening, tensors = prelude
    census = ONE_STEP.fill("census", imports=False, values={"LR": repr(setup.lr), "SCALE": repr(scale)})
    code = f"{opening}\n\n\n{census}"
    return FailureRepro(
        "training",
        f"{setup.name}: one fp16-autocast step with torch's GradScaler at {scale:g}, where the fp32 gradients times "
        "the scale overflow fp16: the step skipped and the scale backed off",
        code,
        "exact: an overflow in the scaled gradients skips the step and backs the scale off (GradScaler's rule)",
        tensors,
        device=str(device),
    )


def op_local_error(
    what: str,
    call: str,
    tensors: Mapping[str, torch.Tensor],
    unit_dtype: torch.dtype,
    budget_u: float,
    origin: str,
    *,
    device: str = "cpu",
    cast: bool = False,
) -> FailureRepro:
    """One aten op of a training step, on the inputs it saw, against itself in float64: its local
    error ``max |out - ref| / max |ref|`` in units of ``unit_dtype``'s unit roundoff (the op's
    output format, or the recipe's where the output's is narrower). ``cast``: a cast, whose exact
    result is its input (``t0``)."""
    u = format_of(unit_dtype).unit_roundoff
    reference = (
        "# reference: a cast's exact result is its input\nref = t0.double()"
        if cast
        else f"""# reference: the same op on the same inputs upcast exactly to float64
{upcast_src(tensors)}
ref = {call}
ref = ref[0] if isinstance(ref, (tuple, list)) else ref"""
    )
    code = f"""got = {call}
got = got[0] if isinstance(got, (tuple, list)) else got  # an op with several outputs: the first
{reference}
U = {u!r}  # unit roundoff of {str(unit_dtype).removeprefix("torch.")}
measured = float((got.double() - ref).abs().max() / ref.abs().max()) / U  # the op's own error, in u
allowed = {budget_u!r}"""
    return FailureRepro("op", what, code, origin, dict(tensors), device=device)


def op_repro_of(o: OpPrint | None, device: torch.device | str = "cpu") -> FailureRepro | None:
    """The standalone reproduction of an op over its budget (None: no op, or its call was not kept):
    the op alone on the inputs it saw, against itself in float64."""
    if o is None or o.call is None:
        return None

    unit = o.unit or o.dtype
    return op_local_error(
        f"{o.describe()}: its own error against float64 on the inputs it saw, in u of {unit}",
        o.call.source,
        o.call.tensors,
        getattr(torch, unit),
        o.budget_u,
        "CAST_BUDGET_U: one rounding to nearest errs by less than 1 u"
        if o.cast
        else "OP_BUDGET_U: 1 u for rounding the output once, plus what kernels keeping low-precision intermediates "
        "add (measured clean at most 3.8 u on the harness's models: about twice that)",
        device=str(device),
        cast=o.cast,
    )
