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

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
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
        return None  # through the Trainer's own checkpoints (run_resumed)

    def run(self, seed: int, precision: Precision, loop: Loop) -> None:
        with tempfile.TemporaryDirectory(prefix="amp-harness-hf-") as out:
            self._train(seed, precision, loop, out)

    def run_resumed(self, seed: int, precision: Precision, loop: Loop, at: int) -> None:
        """The run saved by the Trainer itself (``save_steps``) after ``at`` steps and stopped, then
        a fresh Trainer resumed from that checkpoint (``resume_from_checkpoint``) to the end: what
        its model, optimizer, scheduler, scaler, RNG and data position restore."""
        with tempfile.TemporaryDirectory(prefix="amp-harness-hf-") as out:
            self._train(seed, precision, loop, out, stop_at=at)
            checkpoint = os.path.join(out, f"checkpoint-{at}")
            if not os.path.isdir(checkpoint):
                raise RuntimeError(f"the Trainer saved no checkpoint at step {at} (save_steps={at}): {os.listdir(out)}")
            self._train(seed, precision, loop, out, resume=checkpoint)

    def _train(
        self,
        seed: int,
        precision: Precision,
        loop: Loop,
        out: str,
        stop_at: int | None = None,
        resume: str | None = None,
    ) -> None:
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
                self.trainer.float64_losses = []
                loop.begin(
                    {"model": kw.get("model"), "optimizer": kw.get("optimizer"), "scheduler": kw.get("lr_scheduler")}
                )

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                # the step's loss: its micro-batches' losses as training_step returns them (each
                # already divided by the accumulation steps), summed
                losses = self.trainer.micro_losses
                float64 = {"loss": list(self.trainer.float64_losses)} if self.trainer.float64_losses else None
                loop.end(sum(float(x) for x in losses), {"loss": losses[0].dtype} if losses else None, float64)
                if stop_at is not None and state.global_step >= stop_at:
                    control.should_save, control.should_training_stop = True, True

        class Recording(base):  # type: ignore[misc]
            def training_step(self, *args: Any, **kwargs: Any) -> Any:
                loss = super().training_step(*args, **kwargs)
                self.micro_losses.append(loss.detach())
                return loss

            def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
                labels = inputs.get("labels") if isinstance(inputs, dict) else None  # compute_loss_func pops them
                seen: dict[str, Any] = {}
                handle = model.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out))
                try:
                    result = super().compute_loss(model, inputs, *args, **kwargs)
                finally:
                    handle.remove()
                loss = result[0] if isinstance(result, tuple) else result
                ref = _float64_loss(self.compute_loss_func, seen.get("out"), labels, kwargs.get("num_items_in_batch"))
                if ref is not None and isinstance(loss, torch.Tensor):
                    self.float64_losses.append((float(loss.detach().double()), ref))
                return result

        watch = Watch()
        saving = {"save_strategy": "no"} if stop_at is None else {"save_strategy": "steps", "save_steps": stop_at}
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=self.steps,
            seed=seed,
            data_seed=seed,
            use_cpu=precision.device.type == "cpu",
            report_to=[],
            logging_strategy="no",
            disable_tqdm=True,
            **saving,
            **precision.hf,
            **self.args,
        )
        dataset = list(self.dataset(seed) if callable(self.dataset) else self.dataset)
        transformers.set_seed(seed)
        trainer = Recording(model=self.model(seed), args=args, train_dataset=dataset, callbacks=[watch], **self.trainer)
        watch.trainer = trainer
        trainer.train(resume_from_checkpoint=resume)
        reset_state()


def _float64_loss(loss_func: Any, outputs: Any, labels: Any, num_items_in_batch: Any) -> float | None:
    """The user's ``compute_loss_func`` on the same outputs with their logits in float64, outside
    autocast and with its casts to low precision kept in float64 (:class:`_KeptWide`): the loss as
    its inputs define it, without the loss's own rounding. None where the
    harness cannot see those inputs (no ``compute_loss_func``, no logits or labels)."""
    logits = getattr(outputs, "logits", None)
    if loss_func is None or not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        return None
    wide = type(outputs)(**{**outputs, "logits": logits.detach().double()})
    with torch.no_grad(), torch.autocast(logits.device.type, enabled=False), _KeptWide():
        ref = loss_func(wide, labels, num_items_in_batch=num_items_in_batch)
    return float(ref.double()) if isinstance(ref, torch.Tensor) and ref.numel() == 1 else None


_LOW = (torch.bfloat16, torch.float16)


class _KeptWide(torch.overrides.TorchFunctionMode):
    """Casts of a floating tensor to bf16 or fp16 (``to``, ``bfloat16``, ``half``, ``type``) leave it
    as it is: a loss function that casts its logits down computes, here, in the logits' float64."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in (torch.Tensor.bfloat16, torch.Tensor.half):
            return args[0]
        if func in (torch.Tensor.to, torch.Tensor.type):
            target = kwargs.get("dtype", next((a for a in args[1:] if isinstance(a, torch.dtype)), None))
            if target in _LOW and args[0].is_floating_point():
                rest = {k: v for k, v in kwargs.items() if k != "dtype"}
                others = [a for a in args[1:] if not isinstance(a, torch.dtype)]
                return func(args[0], *others, **rest) if others or rest else args[0]
        return func(*args, **kwargs)
