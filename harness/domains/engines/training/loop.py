"""The training loop: one recipe on one setup and seed, deterministic on a given stack."""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.domains.engines.training.emulation import RoundingMode
from harness.domains.engines.training.recipes import (
    DATA_SEED_OFFSET,
    INIT_SEED,
    Recipe,
    Setup,
    cast_floating,
    split,
    tensors,
    to_device,
    tree_map,
)


@dataclass
class Run:
    recipe: str
    seed: int
    losses: list[float]
    #: fp32 loss of the current weights on a fixed evaluation batch, at each checkpoint step
    eval_losses: dict[int, float] = field(default_factory=dict)
    skipped_at: list[int] = field(default_factory=list)
    zero_grad_share: float = 0.0
    #: a scaler's scale before each step, and after the last update
    scales: list[float] = field(default_factory=list)
    final_scale: float | None = None
    #: optimizer steps taken (not skipped by a scaler, not replayed as skipped)
    taken_steps: int = 0
    #: ||final - initial|| / ||initial|| over all trainable parameters
    param_change: float = 0.0
    #: parameters (state_dict copies) at the steps asked for with ``keep_weights_at``
    weights: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    #: the training state after the steps asked for with ``keep_states_at`` (the AMP lane's states)
    states: dict[int, State] = field(default_factory=dict)
    #: a clipping recipe's total gradient norm at each step, as clip_grad_norm_ returned it
    clip_norms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class State:
    """Where a run stood after a step: enough to take the next step again in another precision."""

    #: the model's state_dict (parameters and buffers), copied
    model: dict[str, torch.Tensor]
    #: the optimizer's state_dict (moments, step counts, learning rate), copied
    optimizer: dict[str, Any]
    #: the batch of the next step, as the batch function gave it (on the CPU)
    next_batch: Any
    #: a scaler's scale before the next step (None without a scaler)
    scale: float | None


#: Generators of injected gradient noise (Recipe.grad_noise) start here: apart from all the above.
NOISE_SEED_OFFSET = 200_000
#: A resumed run's fresh model is initialised from the setup's initialisation seed plus this:
#: other weights than the saved ones, so that the checkpoint must supply them.
RESUME_SEED_OFFSET = 300_000


@dataclass
class _Live:
    """What a run trains with; replaced wholesale when the run resumes from a checkpoint."""

    model: nn.Module
    params: list[nn.Parameter]
    forward_model: nn.Module
    opt: torch.optim.Optimizer
    schedule: Any
    scaler: torch.amp.GradScaler | None


def _build(
    setup: Setup,
    recipe: Recipe,
    dev: torch.device,
    fp32_modules: Sequence[str],
    compile: Callable[[nn.Module], nn.Module] | None,
    gate: bool,
    init_seed: int = INIT_SEED,
) -> tuple[_Live, torch.Tensor | None]:
    """A run's model (after the caller seeded torch), optimizer, schedule and scaler, as the setup makes them."""
    model = setup.build(dev, init_seed)
    if recipe.params_dtype is not None:
        model = model.to(recipe.params_dtype)
    outside_autocast(model, fp32_modules)
    params = [p for p in model.parameters() if p.requires_grad]
    gate_tensor = overflow_gate(model) if gate else None
    forward_model = compile(model) if compile is not None else model
    lr = setup.lr / recipe.loss_factor if setup.plain_sgd else setup.lr
    opt = setup.make_optimizer(params, lr)
    schedule = setup.schedule(opt) if setup.schedule is not None else None
    scaler = setup.make_scaler(dev.type) if recipe.scaler else None
    return _Live(model, params, forward_model, opt, schedule, scaler), gate_tensor


def _resume(live: _Live, fresh: _Live, gen: torch.Generator, dev: torch.device) -> None:
    """Save ``live`` as a training script would (one ``torch.save`` of the model, optimizer,
    schedule, scaler and RNG states, and the data generator's) and load it into ``fresh``."""
    buf = io.BytesIO()
    torch.save(
        {
            "model": live.model.state_dict(),
            "optimizer": live.opt.state_dict(),
            "schedule": live.schedule.state_dict() if live.schedule is not None else None,
            "scaler": live.scaler.state_dict() if live.scaler is not None else None,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None,
            "data": gen.get_state(),
        },
        buf,
    )
    buf.seek(0)
    saved = torch.load(buf, weights_only=False)
    fresh.model.load_state_dict(saved["model"])
    fresh.opt.load_state_dict(saved["optimizer"])
    if fresh.schedule is not None:
        fresh.schedule.load_state_dict(saved["schedule"])
    if fresh.scaler is not None:
        fresh.scaler.load_state_dict(saved["scaler"])
    torch.set_rng_state(saved["rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state(saved["cuda_rng"], dev)
    gen.set_state(saved["data"])


def overflow_gate(model: nn.Module) -> torch.Tensor:
    """A scalar the output of the model's first module with parameters is multiplied by, inside the
    forward pass (inside the compiled graph when the model is compiled): 1 normally; the loop sets
    it to inf at ``overflow_at`` steps. Any model's forward overflows there (an embedding's output
    scaled by a finite factor would be normalised away by a LayerNorm), and no input is touched."""
    first = next(m for m in model.modules() if next(m.parameters(recurse=False), None) is not None)
    gate = torch.ones((), device=next(first.parameters()).device)
    inner = first.forward

    # a wrapped forward, not a forward hook: Dynamo reads .grad of a hook's non-leaf output
    # (an embedding's), a warning this project's pytest configuration makes an error
    def forward(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs) * gate

    first.forward = forward
    return gate


def evaluate(model: nn.Module, setup: Setup, inputs: Any, targets: Any) -> float:
    """fp32 loss of the model's current weights on a fixed batch (training mode kept: BatchNorm
    uses batch statistics, so no running-statistics drift enters the comparison)."""
    with torch.no_grad(), torch.autocast(inputs_device(inputs).type, enabled=False):
        params = next(model.parameters())
        out = setup.forward(model, cast_floating(inputs, params.dtype))
        return float(setup.loss_from(out, targets))


def inputs_device(inputs: Any) -> torch.device:
    found = tensors(inputs)
    return found[0].device if found else torch.device("cpu")


def outside_autocast(model: nn.Module, names: Sequence[str]) -> None:
    """Run the named submodules in fp32 outside autocast (the usual remedy for a module that is
    numerically fragile in low precision): floating inputs cast to fp32, autocast disabled inside."""
    modules = dict(model.named_modules())
    for name in names:
        if name not in modules:
            raise KeyError(
                f"no module {name!r} in {type(model).__name__}; modules: {', '.join(list(modules)[1:12])} ..."
            )
        module = modules[name]
        inner = module.forward

        def forward(*args: Any, _inner: Callable[..., Any] = inner, **kwargs: Any) -> Any:
            with torch.autocast(inputs_device((args, kwargs)).type, enabled=False):
                return _inner(*cast_floating(args, torch.float32), **cast_floating(kwargs, torch.float32))

        module.forward = forward


def _param_vector(params: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().double().flatten() for p in params]) if params else torch.zeros(0, dtype=torch.float64)


def _gradients(
    setup: Setup,
    recipe: Recipe,
    forward_model: nn.Module,
    params: Sequence[nn.Parameter],
    scaler: torch.amp.GradScaler | None,
    inputs: Any,
    targets: Any,
    dev: torch.device,
    mode: contextlib.AbstractContextManager[Any] | None = None,
) -> float:
    """Forward and backward over the recipe's micro-batches; the parameters' ``.grad`` hold the
    step's gradient (scaled where a GradScaler scales). Returns the step's training loss."""
    acc: list[torch.Tensor] | None = None
    step_loss = 0.0
    for xs, ys in zip(split(inputs, recipe.micro_batches), split(targets, recipe.micro_batches), strict=True):
        emulated: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if mode is not None:
            emulated = mode
        elif recipe.emulate is not None:
            emulated = RoundingMode(recipe.emulate)
        with (
            torch.autocast(dev.type, dtype=recipe.dtype or torch.bfloat16, enabled=recipe.dtype is not None),
            emulated,
        ):
            out = setup.forward(
                forward_model, cast_floating(xs, recipe.params_dtype) if recipe.params_dtype is not None else xs
            )
            loss = setup.loss_from(out, ys) / recipe.micro_batches
        step_loss += loss.detach().item()
        scaled = loss * recipe.loss_factor * (recipe.static_scale or 1.0)
        (scaler.scale(scaled) if scaler is not None else scaled).backward()  # type: ignore[no-untyped-call]
        if recipe.static_scale is not None or recipe.grad_accum_dtype is not None:
            # each micro-batch's (unscaled) gradient is summed into a buffer of the accumulation dtype
            # (at least fp32: an emulated float64 recipe keeps fp64 buffers, as fp32 master gradients
            # are exact for its fp16/bf16-rounded gradients)
            buf = recipe.grad_accum_dtype or (torch.float64 if recipe.emulate is not None else torch.float32)
            grads = [
                (p.grad.to(torch.promote_types(p.grad.dtype, torch.float32)) / (recipe.static_scale or 1.0)).to(buf)
                if p.grad is not None
                else torch.zeros_like(p, dtype=buf)
                for p in params
            ]
            acc = grads if acc is None else [a + g for a, g in zip(acc, grads, strict=True)]
            for p in params:
                p.grad = None
    if acc is not None:
        for p, a in zip(params, acc, strict=True):
            p.grad = a.to(p.dtype)
    return step_loss


def _perturb(recipe: Recipe, params: Sequence[nn.Parameter], seed: int, step: int) -> None:
    """Recipe.grad_noise: a numerical fault of known size (relative, per element), seeded by (seed, step)."""
    if recipe.grad_noise is None:
        return
    noise = torch.Generator().manual_seed(NOISE_SEED_OFFSET + 1_000_000 * recipe.noise_seed + 1000 * seed + step)
    for p in params:
        if p.grad is not None:
            p.grad.mul_(1 + recipe.grad_noise * torch.randn(p.grad.shape, generator=noise).to(p.grad))


def _unscale_and_clip(
    recipe: Recipe, params: Sequence[nn.Parameter], opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None
) -> float | None:
    """Unscale (with a scaler) and clip, for a recipe that clips; the total norm, else None."""
    if scaler is not None and recipe.clip is not None:
        scaler.unscale_(opt)
    if recipe.clip is not None:
        return float(torch.nn.utils.clip_grad_norm_(params, recipe.clip))
    return None


def _copy_state(obj: Any) -> Any:
    """A copy of a state_dict or batch: every tensor cloned (``batches.tree_map``)."""
    return tree_map(lambda t: t.detach().clone(), obj)


def train(
    setup: Setup,
    recipe: Recipe,
    seed: int = 0,
    device: torch.device | str = "cpu",
    skip_steps: frozenset[int] = frozenset(),
    fp32_modules: Sequence[str] = (),
    keep_weights_at: frozenset[int] = frozenset(),
    compile: Callable[[nn.Module], nn.Module] | None = None,
    overflow_at: frozenset[int] = frozenset(),
    keep_states_at: frozenset[int] = frozenset(),
    plant: Mapping[int, Callable[[Sequence[nn.Parameter]], None]] | None = None,
    resume_at: int | None = None,
) -> Run:
    """Run ``setup`` with ``recipe``; deterministic for a given seed on a given stack.

    ``skip_steps`` replays a GradScaler's skipped steps on a reference run (no optimizer step there),
    so that parity compares numerics, not the scaler's calibration of its first steps.
    ``fp32_modules`` runs those submodules outside autocast; ``keep_weights_at`` keeps copies of
    the parameters after those steps (both for :mod:`harness.domains.engines.training.diagnosis`).
    ``compile`` wraps the model for the forward and backward passes (``torch.compile``: the model's
    parameters stay the ones the optimizer steps). ``overflow_at``: at those steps the forward pass
    overflows (:func:`overflow_gate`: inside the compiled graph when compiled) and a scaler must
    skip the step. ``keep_states_at``: the training :class:`State` after those steps (the AMP
    lane, :mod:`harness.domains.engines.training.amp_lane`, takes the next step again from it).
    ``plant``: at those steps, after the backward pass and before unscaling, clipping and the
    optimizer step, the callable edits the (scaled) gradients of the trainable parameters (a
    non-finite element: :mod:`harness.domains.engines.training.overflow`).
    ``resume_at``: before that step the run is saved (model, optimizer, schedule, scaler, torch's
    RNG and the data generator) and continued in fresh objects loaded from the checkpoint, as a
    training script resumes after a restart.
    """
    dev = torch.device(device)
    torch.manual_seed(seed)
    live, gate = _build(setup, recipe, dev, fp32_modules, compile, bool(overflow_at))
    model, params, forward_model, opt, schedule, scaler = (
        live.model, live.params, live.forward_model, live.opt, live.schedule, live.scaler
    )  # fmt: skip
    initial = _param_vector(params)
    gen = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
    eval_inputs, eval_targets = setup.eval_batch(dev)
    checkpoints = set(setup.checkpoints())
    run = Run(recipe.name, seed, [])
    zero, total = 0, 0
    pending: tuple[int, dict[str, torch.Tensor], dict[str, Any]] | None = None
    for step in range(setup.steps + (1 if setup.steps - 1 in keep_states_at else 0)):
        if step == resume_at:
            fresh, gate = _build(
                setup, recipe, dev, fp32_modules, compile, bool(overflow_at), INIT_SEED + RESUME_SEED_OFFSET
            )
            _resume(live, fresh, gen, dev)
            live = fresh
            model, params, forward_model, opt, schedule, scaler = (
                live.model, live.params, live.forward_model, live.opt, live.schedule, live.scaler
            )  # fmt: skip
        batch = setup.batch(step, gen)
        if pending is not None:
            kept, weights, optimizer = pending
            scale = scaler.get_scale() if scaler is not None else None
            run.states[kept] = State(weights, optimizer, _copy_state(batch), scale)
            pending = None
        if step == setup.steps:
            break  # the batch after the last step, drawn only for its kept state
        inputs, targets = to_device(batch, dev)
        if gate is not None:
            gate.fill_(math.inf if step in overflow_at else 1.0)
        opt.zero_grad(set_to_none=True)
        step_loss = _gradients(setup, recipe, forward_model, params, scaler, inputs, targets, dev)
        _perturb(recipe, params, seed, step)
        if plant is not None and step in plant:
            plant[step](params)
        norm = _unscale_and_clip(recipe, params, opt, scaler)
        if norm is not None:
            run.clip_norms.append(norm)
        grads = [p.grad for p in params if p.grad is not None]
        zero += sum(int((g == 0).sum()) for g in grads)
        total += sum(g.numel() for g in grads)
        if scaler is not None:
            before = scaler.get_scale()
            run.scales.append(before)
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < before:
                run.skipped_at.append(step)
            else:
                run.taken_steps += 1
        elif step not in skip_steps:
            opt.step()
            run.taken_steps += 1
        if schedule is not None:
            with warnings.catch_warnings():
                # a scaler-skipped first step makes torch warn that the scheduler stepped before the
                # optimizer: stepping it every training step is what the fp32 reference does too
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")
                schedule.step()
        run.losses.append(step_loss)
        if step in checkpoints:
            run.eval_losses[step] = evaluate(model, setup, eval_inputs, eval_targets)
        if step in keep_weights_at:
            run.weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if step in keep_states_at:
            pending = (step, _copy_state(model.state_dict()), _copy_state(opt.state_dict()))
    run.zero_grad_share = zero / max(total, 1)
    run.final_scale = scaler.get_scale() if scaler is not None else None
    norm = float(initial.norm())
    moved = float((_param_vector(params) - initial).norm())
    run.param_change = moved / norm if norm > 0 else moved
    return run


def _load(
    setup: Setup, state: State, dev: torch.device, dtype: torch.dtype | None
) -> tuple[nn.Module, list[nn.Parameter], torch.optim.Optimizer]:
    """The model of ``state`` in ``dtype`` (default fp32) with dropout off, and its optimizer loaded."""
    model = setup.model(INIT_SEED)
    if dtype is not None:
        model = model.to(dtype)
    model.load_state_dict(state.model)
    model = model.to(dev)
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = setup.make_optimizer(params, setup.lr)
    opt.load_state_dict(_copy_state(state.optimizer))
    return model, params, opt


def _batch_of(state: State, dev: torch.device, dtype: torch.dtype | None) -> tuple[Any, Any]:
    inputs, targets = to_device(state.next_batch, dev)
    if dtype == torch.float64:
        inputs, targets = cast_floating(inputs, torch.float64), cast_floating(targets, torch.float64)
    return inputs, targets


def step_from(
    setup: Setup,
    recipe: Recipe,
    state: State,
    device: torch.device | str = "cpu",
    params_dtype: torch.dtype | None = None,
    scale: float | None = None,
    seed: int = 0,
    step: int = 0,
    mode: contextlib.AbstractContextManager[Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step of ``recipe`` from ``state``: (parameters before, parameters after), each
    flattened to float64. The model is built in ``params_dtype`` (else the recipe's, else fp32)
    and loaded from the state; the optimizer is the setup's, loaded from the state (its moments
    cast to the parameters' dtype); a recipe with a scaler starts it at ``scale`` (default: the
    state's). Dropout is off (the model in eval mode, batch-statistics normalisation in training
    mode): random masks drawn in different dtypes differ, and the step is compared across dtypes.
    A step a scaler skips leaves the parameters as they were; a float64 model gets float64 inputs.
    ``mode``: a context the forward passes run in (an emulated recipe's RoundingMode, which counts
    the calls it rounded; the AMP lane's correctly rounded attention)."""
    dev = torch.device(device)
    dtype = params_dtype or recipe.params_dtype
    model, params, opt = _load(setup, state, dev, dtype)
    start = scale if scale is not None else state.scale
    scaler = torch.amp.GradScaler(dev.type, init_scale=start or 2.0**16) if recipe.scaler else None
    before = _param_vector(params)
    inputs, targets = _batch_of(state, dev, dtype)
    opt.zero_grad(set_to_none=True)
    _gradients(setup, recipe, model, params, scaler, inputs, targets, dev, mode)
    _perturb(recipe, params, seed, step)
    _unscale_and_clip(recipe, params, opt, scaler)
    if scaler is not None:
        scaler.step(opt)
    else:
        opt.step()
    return before, _param_vector(params)


def largest_gradient(setup: Setup, recipe: Recipe, state: State, device: torch.device | str = "cpu") -> float:
    """The largest |gradient| of ``recipe``'s fp32 counterpart's next step from ``state``, in float64
    (the fp16 emulation's loss scale is chosen from it)."""
    dev = torch.device(device)
    model, params, _ = _load(setup, state, dev, torch.float64)
    inputs, targets = _batch_of(state, dev, torch.float64)
    _gradients(setup, recipe.fp32_counterpart(), model, params, None, inputs, targets, dev)
    found = [float(p.grad.abs().max()) for p in params if p.grad is not None and p.grad.numel()]
    return max(found, default=0.0)


def resume_differences(whole: Run, resumed: Run) -> list[str]:
    """Where a resumed run parts from the uninterrupted one, step by step in words (empty: bit for
    bit the same losses, scales, skipped steps and final weights; both runs kept their weights
    after the last step)."""
    out = []
    scales: list[tuple[float | None, float | None]] = list(zip(whole.scales, resumed.scales, strict=True))
    scales = scales or [(None, None)] * len(whole.losses)  # a recipe without a scaler
    for i, ((a, b), (sa, sb)) in enumerate(zip(zip(whole.losses, resumed.losses, strict=True), scales, strict=True)):
        parts = [] if a == b or (math.isnan(a) and math.isnan(b)) else [f"loss {a!r}, resumed {b!r}"]
        parts += [] if sa == sb else [f"scale {sa!r}, resumed {sb!r}"]
        if parts:
            out.append(f"step {i}: {'; '.join(parts)}")
    if whole.skipped_at != resumed.skipped_at:
        out.append(f"skipped steps {whole.skipped_at}, resumed {resumed.skipped_at}")
    for step, weights in whole.weights.items():
        other = resumed.weights.get(step, {})
        changed = [k for k, v in weights.items() if k not in other or not torch.equal(v, other[k])]
        if changed:
            out.append(f"after step {step}: {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''} differ")
    return out
