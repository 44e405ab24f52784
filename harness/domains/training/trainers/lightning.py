"""Lightning's ``Trainer(precision=...)``: ``32-true``, ``bf16-mixed`` or ``16-mixed`` (its own
GradScaler), automatic or manual optimization, its scheduler configuration; the harness watches
from a ``Callback`` and reads each step's loss from what ``training_step`` returned.

Example::

    program = LightningProgram("regressor", module=lambda seed: MyModule(), batches=batches)
    amp_training.check_program(program, [BF16, FP16_SCALER])
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.domains.training.trainers import require
from harness.domains.training.user_step import Loop, Precision


@dataclass
class LightningProgram:
    """``module(seed)`` -> a ``LightningModule``; ``batches``: what its ``training_step`` takes (or
    ``batches(seed)``); ``trainer``: more ``Trainer`` keywords."""

    name: str
    module: Callable[[int], Any]
    batches: Sequence[Any] | Callable[[int], Sequence[Any]]
    trainer: dict[str, Any] = field(default_factory=dict)
    #: on a CPU Lightning swaps ``16-mixed`` for ``bf16-mixed`` (saying so once); the program hands it
    #: ``MixedPrecision("16-mixed", "cpu")`` instead, so that its GradScaler path is what runs. True:
    #: pass the string as a user would (the fp16 recipe is then INCONCLUSIVE on a CPU)
    as_configured: bool = False

    @property
    def resumable(self) -> str | None:
        return None  # through Lightning's own checkpoints (run_resumed)

    def run(self, seed: int, precision: Precision, loop: Loop) -> None:
        self._fit(seed, precision, loop)

    def run_resumed(self, seed: int, precision: Precision, loop: Loop, at: int) -> None:
        """The run saved by Lightning after ``at`` steps (``Trainer.save_checkpoint``, mid-epoch) and stopped,
        then a fresh module and Trainer fitted from it (``fit(ckpt_path=...)``) to the end: what its
        model, optimizers, schedulers, precision plugin (the scaler) and loops restore."""
        with tempfile.TemporaryDirectory(prefix="amp-harness-lightning-") as out:
            path = os.path.join(out, "resume.ckpt")
            self._fit(seed, precision, loop, stop_at=at, save=path)
            self._fit(seed, precision, loop, resume=path)

    def _fit(
        self,
        seed: int,
        precision: Precision,
        loop: Loop,
        stop_at: int | None = None,
        save: str | None = None,
        resume: str | None = None,
    ) -> None:
        lightning = require("lightning")

        callback: Any = lightning.pytorch.Callback

        class Watch(callback):  # type: ignore[misc]
            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
                loop.begin(
                    {
                        "model": module,
                        "optimizers": list(trainer.optimizers),
                        "schedulers": [c.scheduler for c in trainer.lr_scheduler_configs],
                        "scaler": getattr(trainer.precision_plugin, "scaler", None),
                    }
                )

            def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, index: int) -> None:
                loop.end(outputs)
                if stop_at is not None and save is not None and trainer.global_step >= stop_at:
                    trainer.save_checkpoint(save)  # mid-epoch, as a step-based ModelCheckpoint saves
                    trainer.should_stop = True

        torch.manual_seed(seed)
        module = self.module(seed)
        data = list(self.batches(seed) if callable(self.batches) else self.batches)
        chosen: dict[str, Any] = {"precision": precision.lightning}
        if precision.dtype is torch.float16 and precision.device.type == "cpu" and not self.as_configured:
            chosen = {"plugins": [lightning.pytorch.plugins.precision.MixedPrecision("16-mixed", "cpu")]}
        loader: Any = ResumableBatches(data)
        with warnings.catch_warnings():
            # its notices (workers, logging, a precision it swapped) concern throughput or are
            # judged by the precision verdict: not errors of the run
            warnings.simplefilter("ignore")
            trainer = lightning.pytorch.Trainer(
                **chosen,
                accelerator=precision.device.type,
                devices=1,
                max_steps=len(data),
                max_epochs=1,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
                callbacks=[Watch()],
                **self.trainer,
            )
            trainer.fit(module, train_dataloaders=loader, ckpt_path=resume)


class ResumableBatches:
    """The program's batches in order, as Lightning's stateful-loader protocol wants them
    (``state_dict`` / ``load_state_dict``): a mid-epoch checkpoint resumes at the next batch, where a
    plain ``DataLoader`` restarts the epoch (Lightning warns that this is unreliable), so the resume
    verdict judges what Lightning restores, not a data order the harness chose."""

    def __init__(self, data: Sequence[Any]) -> None:
        self.data = list(data)
        self.taken = 0  # batches handed out this epoch
        self._start = 0

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[Any]:
        start, self._start = self._start, 0
        for i in range(start, len(self.data)):
            self.taken = i + 1
            yield self.data[i]

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._start = int(state["taken"])
