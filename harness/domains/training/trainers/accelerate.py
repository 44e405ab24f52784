"""Accelerate's loop, as its documentation writes it: ``Accelerator(mixed_precision=...)``,
``prepare``, ``accelerator.backward``, ``clip_grad_norm_``, the prepared optimizer and scheduler.

Example::

    program = AccelerateProgram("llama", model=tiny_llama, optimizer=lambda p: torch.optim.AdamW(p, 1e-3),
                                batches=batches, clip=1.0)
    amp_training.check_program(program, [BF16, FP16_SCALER])

Accelerate on a CPU applies ``bf16`` and ignores ``fp16`` (it trains in fp32 and says nothing):
the harness then finds the fp16 run bitwise the fp32 run and calls it INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.domains.training.trainers import require
from harness.domains.training.user_step import Loop, Precision


def reset_state() -> None:
    """Forget the process-wide state of the last ``Accelerator`` (its mixed precision among it):
    each run of the harness builds its own."""
    state = require("accelerate").state
    state.AcceleratorState._reset_state(True)
    state.PartialState._reset_state()


@dataclass
class AccelerateProgram:
    """``model(seed)`` -> a module whose output has a ``.loss`` (or ``loss(output, batch)`` gives it);
    ``batches``: keyword-input dicts (or ``batches(seed)``); the optimizer and scheduler from factories."""

    name: str
    model: Callable[[int], nn.Module]
    optimizer: Callable[[Any], torch.optim.Optimizer]
    batches: Sequence[Any] | Callable[[int], Sequence[Any]]
    loss: Callable[[Any, Any], torch.Tensor] | None = None
    scheduler: Callable[[torch.optim.Optimizer], Any] | None = None
    clip: float | None = None
    #: micro-batches a step accumulates over (``Accelerator(gradient_accumulation_steps=...)`` and
    #: ``with accelerator.accumulate(model)``: the prepared optimizer steps once per group)
    accumulate: int = 1

    @property
    def resumable(self) -> str | None:
        return "Accelerate's save_state/load_state is not driven by the harness: use check_step with your loop"

    def run(self, seed: int, precision: Precision, loop: Loop) -> None:
        accelerate = require("accelerate")
        reset_state()
        if isinstance(self.accumulate, bool) or not isinstance(self.accumulate, int) or self.accumulate < 1:
            raise ValueError(f"accumulate={self.accumulate!r}: micro-batches per optimizer step (at least 1)")
        accelerator = accelerate.Accelerator(
            mixed_precision=precision.accelerate,
            cpu=precision.device.type == "cpu",
            gradient_accumulation_steps=self.accumulate,
        )
        torch.manual_seed(seed)
        model = self.model(seed)
        optimizer = self.optimizer(model.parameters())
        scheduler = self.scheduler(optimizer) if self.scheduler is not None else None
        if scheduler is not None:
            model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        else:
            model, optimizer = accelerator.prepare(model, optimizer)
        data = self.batches(seed) if callable(self.batches) else self.batches
        for batch in data:
            loop.begin({"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": accelerator.scaler})
            with accelerator.accumulate(model):
                out = model(**batch) if isinstance(batch, dict) else model(batch)
                loss = self.loss(out, batch) if self.loss is not None else out.loss
                accelerator.backward(loss)
                if self.clip is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), self.clip)
                optimizer.step()
                if scheduler is not None:
                    scheduler.step()
                optimizer.zero_grad()
            loop.end(loss)
        reset_state()
