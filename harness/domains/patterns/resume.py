"""Save and resume mid-run: model, optimizer, GradScaler and RNG state saved at step k and loaded
into fresh objects must continue exactly as the uninterrupted run does (bitwise on the CPU): the
same losses, the same loss scale before every step, the same final parameters. A scaler whose
state is not restored starts again at its initial scale: the classic loss spike after a restart.

The model has dropout, so the RNG state is part of what must be restored; the fresh model is
initialised from another seed, so its weights must come from the checkpoint."""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch
from torch import nn

WIDTH, BATCH, STEPS, SAVE_AT = 32, 16, 8, 4
#: GradScaler's growth interval here: short enough that the scale moves within the run, so a
#: scaler restored wrongly shows in the scale it steps with.
GROWTH_INTERVAL = 2
INIT_SCALE = 2.0**8


def _model(seed: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 1)
    ).to(device)


def _batch(step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, WIDTH, generator=g).to(device), torch.randn(BATCH, 1, generator=g).to(device)


@dataclass
class _Run:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler


def _fresh(seed: int, device: torch.device, fp16: bool) -> _Run:
    m = _model(seed, device)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device.type, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL, enabled=fp16)
    return _Run(m, opt, scaler)


@dataclass(frozen=True)
class Trajectory:
    """Per step: the loss (as float64 from its exact bits) and the scale it was stepped with; the
    final parameters."""

    losses: tuple[float, ...]
    scales: tuple[float, ...]
    params: tuple[torch.Tensor, ...]


def _step(run: _Run, step: int, device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    x, y = _batch(step, device)
    run.optimizer.zero_grad(set_to_none=True)
    scale = run.scaler.get_scale() if run.scaler.is_enabled() else 1.0
    with torch.autocast(device.type, dtype=dtype):
        out = run.model(x)
    loss = nn.functional.mse_loss(out.float(), y)
    torch.autograd.backward(run.scaler.scale(loss))
    run.scaler.step(run.optimizer)
    run.scaler.update()
    return float(loss.detach()), float(scale)


def trajectory(device: torch.device, dtype: torch.dtype, resume_at: int | None) -> Trajectory:
    """The run of STEPS steps, uninterrupted (``resume_at=None``) or saved after ``resume_at``
    steps and continued in fresh objects loaded from the checkpoint (an in-memory ``torch.save``)."""
    fp16 = dtype == torch.float16
    torch.manual_seed(0)
    run = _fresh(0, device, fp16)
    torch.manual_seed(7)  # the dropout stream
    losses, scales = [], []
    for step in range(STEPS):
        if step == resume_at:
            buf = io.BytesIO()
            torch.save(
                {
                    "model": run.model.state_dict(),
                    "optimizer": run.optimizer.state_dict(),
                    "scaler": run.scaler.state_dict(),
                    "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
                },
                buf,
            )
            buf.seek(0)
            saved = torch.load(buf, weights_only=False)
            run = _fresh(12345, device, fp16)  # other weights: the checkpoint must supply them
            run.model.load_state_dict(saved["model"])
            run.optimizer.load_state_dict(saved["optimizer"])
            run.scaler.load_state_dict(saved["scaler"])
            torch.set_rng_state(saved["rng"])
            if saved["cuda_rng"] is not None:  # dropout on a GPU draws from the device's generator
                torch.cuda.set_rng_state(saved["cuda_rng"], device)
        loss, scale = _step(run, step, device, dtype)
        losses.append(loss)
        scales.append(scale)
    return Trajectory(tuple(losses), tuple(scales), tuple(p.detach().clone() for p in run.model.parameters()))


def differences(a: Trajectory, b: Trajectory) -> list[str]:
    """Where the resumed run ``b`` parts from the uninterrupted ``a``, in words (empty: bitwise the same)."""
    out = [f"step {i}: loss {x!r} vs {y!r}" for i, (x, y) in enumerate(zip(a.losses, b.losses, strict=True)) if x != y]
    out += [
        f"step {i}: scale {x!r} vs {y!r}" for i, (x, y) in enumerate(zip(a.scales, b.scales, strict=True)) if x != y
    ]
    if not all(torch.equal(x, y) for x, y in zip(a.params, b.params, strict=True)):
        out.append("final parameters differ")
    return out
