"""The training loop: one recipe on one setup and seed, deterministic on a given stack."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from harness.domains.training.recipes import Recipe, Setup, make_optimizer


@dataclass
class Run:
    recipe: str
    seed: int
    losses: list[float]
    #: fp32 loss of the current weights on a fixed evaluation batch, at each checkpoint step
    eval_losses: dict[int, float] = field(default_factory=dict)
    skipped_at: list[int] = field(default_factory=list)
    zero_grad_share: float = 0.0
    scales: list[float] = field(default_factory=list)


#: Models start from one initialisation; seeds vary the data stream. The seed band is then the
#: run-to-run noise of the data order, the spread a practitioner sees re-running the same model.
INIT_SEED = 0
#: Training data of seed s is drawn from generator seed DATA_SEED_OFFSET + s: apart from the
#: initialisation seeds and from the evaluation batch's seed.
DATA_SEED_OFFSET = 10_000
#: Seed of the fixed evaluation batch (never used for training data).
EVAL_SEED = 99_999


def evaluate(model: nn.Module, setup: Setup, x: torch.Tensor, y: torch.Tensor) -> float:
    """fp32 loss of the model's current weights on a fixed batch (training mode kept: BatchNorm
    uses batch statistics, so no running-statistics drift enters the comparison)."""
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
        params = next(model.parameters())
        out = model(x.to(params.dtype) if x.is_floating_point() else x)
        return float(setup.loss(out.float(), y))


def train(
    setup: Setup,
    recipe: Recipe,
    seed: int = 0,
    device: torch.device | str = "cpu",
    skip_steps: frozenset[int] = frozenset(),
) -> Run:
    """Run ``setup`` with ``recipe``; deterministic for a given seed on a given stack.

    ``skip_steps`` replays a GradScaler's skipped steps on a reference run (no optimizer step there),
    so that parity compares numerics, not the scaler's calibration of its first steps.
    """
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = setup.model(INIT_SEED).to(dev)
    if recipe.params_dtype is not None:
        model = model.to(recipe.params_dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = setup.lr / recipe.loss_factor if setup.optimizer == "sgd" else setup.lr
    opt = make_optimizer(setup.optimizer, params, lr)
    scaler = torch.amp.GradScaler(dev.type) if recipe.scaler else None
    gen = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
    eval_x, eval_y = setup.batch(0, torch.Generator().manual_seed(EVAL_SEED))
    eval_x, eval_y = eval_x.to(dev), eval_y.to(dev)
    checkpoints = set(setup.checkpoints())
    run = Run(recipe.name, seed, [])
    zero, total = 0, 0
    for step in range(setup.steps):
        x, y = setup.batch(step, gen)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        acc: list[torch.Tensor] | None = None
        step_loss = 0.0
        for xs, ys in zip(x.chunk(recipe.micro_batches), y.chunk(recipe.micro_batches), strict=True):
            with torch.autocast(dev.type, dtype=recipe.dtype or torch.bfloat16, enabled=recipe.dtype is not None):
                out = model(
                    xs.to(recipe.params_dtype) if recipe.params_dtype is not None and xs.is_floating_point() else xs
                )
                loss = setup.loss(out.float(), ys) / recipe.micro_batches
            step_loss += loss.detach().item()
            scaled = loss * recipe.loss_factor * (recipe.static_scale or 1.0)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()  # type: ignore[no-untyped-call]
            if recipe.static_scale is not None or recipe.grad_accum_dtype is not None:
                # each micro-batch's (unscaled) gradient is summed into a buffer of the accumulation dtype
                buf = recipe.grad_accum_dtype or torch.float32
                grads = [
                    (p.grad.float() / (recipe.static_scale or 1.0)).to(buf)
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
        if scaler is not None and recipe.clip is not None:
            scaler.unscale_(opt)
        if recipe.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, recipe.clip)
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
        elif step not in skip_steps:
            opt.step()
        run.losses.append(step_loss)
        if step in checkpoints:
            run.eval_losses[step] = evaluate(model, setup, eval_x, eval_y)
    run.zero_grad_share = zero / max(total, 1)
    return run
