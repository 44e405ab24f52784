"""The Hugging Face ``Trainer`` as it is: ``TrainingArguments(bf16=True)`` or ``fp16=True``, its own
loss, optimizer and scheduler, ``max_steps`` small; the harness watches from a ``TrainerCallback``
and reads each step's loss from ``training_step``.

Example::

    program = HFTrainerProgram("gpt2", model=tiny_gpt2, dataset=examples, steps=16,
                               args={"learning_rate": 1e-3, "per_device_train_batch_size": 8})
    amp_training.check_program(program, [BF16, FP16_SCALER])

    # your own Trainer, as you train it: its compute_loss, training_step, create_optimizer
    HFTrainerProgram("gpt2", model=tiny_gpt2, dataset=examples, steps=16, trainer_class=MyTrainer)

The Trainer's AMP is Accelerate's: on a CPU its ``fp16=True`` trains in fp32 (INCONCLUSIVE here).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from harness.domains.training.trainers import require
from harness.domains.training.trainers.accelerate import reset_state
from harness.domains.training.user_step import Loop, Precision


@dataclass
class HFTrainerProgram:
    """``model(seed)`` -> a ``PreTrainedModel``; ``dataset``: examples (dicts of tensors) or
    ``dataset(seed)``; ``args``: more ``TrainingArguments`` (the harness sets the precision, the
    seed, ``max_steps``, the device, and turns logging, saving and progress bars off)."""

    name: str
    model: Callable[[int], nn.Module]
    dataset: Sequence[Any] | Callable[[int], Sequence[Any]]
    steps: int
    args: dict[str, Any] = field(default_factory=dict)
    #: more ``Trainer`` keywords (a data collator, ``compute_loss_func``, ...)
    trainer: dict[str, Any] = field(default_factory=dict)
    #: your ``Trainer`` subclass (its own ``compute_loss``, ``training_step``, ``create_optimizer``);
    #: ``transformers.Trainer`` when None
    trainer_class: type | None = None

    @property
    def resumable(self) -> str | None:
        return "the Trainer's checkpoints are not driven by the harness: use check_step with your loop"

    def run(self, seed: int, precision: Precision, loop: Loop) -> None:
        transformers = require("transformers")
        reset_state()

        callback: Any = transformers.TrainerCallback
        base: Any = self.trainer_class or transformers.Trainer
        if not (isinstance(base, type) and issubclass(base, transformers.Trainer)):
            raise TypeError(
                f"trainer_class={base!r}: a subclass of transformers.Trainer (your Trainer as you train it)"
            )

        class Watch(callback):  # type: ignore[misc]
            trainer: Any = None

            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                self.trainer.micro_losses = []
                loop.begin(
                    {"model": kw.get("model"), "optimizer": kw.get("optimizer"), "scheduler": kw.get("lr_scheduler")}
                )

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                # the step's loss: its micro-batches' losses as training_step returns them (each
                # already divided by the accumulation steps), summed
                losses = self.trainer.micro_losses
                loop.end(sum(float(x) for x in losses), {"loss": losses[0].dtype} if losses else None)

        class Recording(base):  # type: ignore[misc]
            def training_step(self, *args: Any, **kwargs: Any) -> Any:
                loss = super().training_step(*args, **kwargs)
                self.micro_losses.append(loss.detach())
                return loss

        watch = Watch()
        with tempfile.TemporaryDirectory(prefix="amp-harness-hf-") as out:
            args = transformers.TrainingArguments(
                output_dir=out,
                max_steps=self.steps,
                seed=seed,
                data_seed=seed,
                use_cpu=precision.device.type == "cpu",
                report_to=[],
                save_strategy="no",
                logging_strategy="no",
                disable_tqdm=True,
                **precision.hf,
                **self.args,
            )
            dataset = list(self.dataset(seed) if callable(self.dataset) else self.dataset)
            transformers.set_seed(seed)
            trainer = Recording(
                model=self.model(seed), args=args, train_dataset=dataset, callbacks=[watch], **self.trainer
            )
            watch.trainer = trainer
            trainer.train()
        reset_state()
