"""Batches and model outputs of any structure: how the training loop calls a model it did not
write, and what it takes from the output.

A batch function returns ``(inputs, targets)``. ``inputs`` is passed to the model as:

- a tensor: ``model(x)``;
- a tuple or list: positional arguments, ``model(*inputs)``;
- a dict: keyword arguments, ``model(**inputs)`` (``input_ids``, ``attention_mask``, ``labels``);
- :class:`Inputs`: both, ``model(*inputs.args, **inputs.kwargs)``.

``targets`` is any structure of tensors, or None where the model computes its own loss. Every
tensor in both is moved to the device and split along dimension 0 for gradient accumulation.

The output is reduced to the tensor a loss function takes by :func:`logits_of` (a tensor; a
tuple's or list's first tensor; a dict's or an object's ``logits``), and a model's own loss is read
by :func:`loss_of` (``.loss`` or ``["loss"]``): Hugging Face outputs, plain tuples and dicts work
without wrappers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Inputs:
    """Positional and keyword inputs of one model call."""

    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def tree_map(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``fn`` applied to every tensor of a structure of tensors, tuples, lists, dicts and Inputs."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, Inputs):
        return Inputs(tree_map(fn, obj.args), tree_map(fn, dict(obj.kwargs)))
    if isinstance(obj, tuple):
        return tuple(tree_map(fn, v) for v in obj)
    if isinstance(obj, list):
        return [tree_map(fn, v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: tree_map(fn, v) for k, v in obj.items()}
    return obj


def tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor of a structure, in order."""
    found: list[torch.Tensor] = []
    tree_map(found.append, obj)
    return found


def split(obj: Any, parts: int) -> list[Any]:
    """A structure of tensors as ``parts`` structures, each tensor chunked along dimension 0."""
    if parts == 1:
        return [obj]
    sizes = {t.shape[0] for t in tensors(obj) if t.dim() > 0}
    if len(sizes) > 1:
        raise ValueError(f"cannot split a batch into micro-batches: tensors have different batch sizes {sorted(sizes)}")
    size = sizes.pop() if sizes else 0
    if size % parts:
        raise ValueError(f"a batch of {size} does not split into {parts} equal micro-batches")

    def part(i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return lambda t: t.chunk(parts)[i] if t.dim() > 0 else t

    return [tree_map(part(i), obj) for i in range(parts)]


def to_device(obj: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(device), obj)


def cast_floating(obj: Any, dtype: torch.dtype) -> Any:
    """Floating tensors of a structure in ``dtype`` (token ids and masks untouched)."""
    return tree_map(lambda t: t.to(dtype) if t.is_floating_point() else t, obj)


def call(model: torch.nn.Module, inputs: Any) -> Any:
    """Call ``model`` with ``inputs`` as the module docstring describes."""
    if isinstance(inputs, torch.Tensor):
        return model(inputs)
    if isinstance(inputs, Inputs):
        return model(*inputs.args, **inputs.kwargs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    raise TypeError(
        f"batch inputs of type {type(inputs).__name__} cannot be passed to a model: return a tensor, a tuple or "
        "list (positional), a dict (keyword) or harness.domains.training.Inputs(args, kwargs)"
    )


def _field(output: Any, name: str) -> Any:
    if isinstance(output, Mapping):
        return output.get(name)
    return getattr(output, name, None)


def logits_of(output: Any) -> torch.Tensor:
    """The tensor a loss function takes from a model output: the output itself if it is a tensor,
    else its ``logits`` (attribute or key), else the first tensor of a tuple or list."""
    if isinstance(output, torch.Tensor):
        return output
    logits = _field(output, "logits")
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)):
        for item in output:
            if isinstance(item, torch.Tensor):
                return item
    raise TypeError(
        f"cannot find the output tensor in a model output of type {type(output).__name__}: it is not a tensor, has "
        "no tensor `logits` (attribute or key) and is not a tuple or list holding a tensor. Give the Setup an "
        "`output=` function that picks the tensor your loss takes"
    )


def loss_of(output: Any) -> torch.Tensor:
    """A model's own loss: ``output.loss`` or ``output["loss"]`` (Hugging Face models given ``labels``)."""
    loss = _field(output, "loss")
    if isinstance(loss, torch.Tensor):
        return loss
    raise TypeError(
        f"the Setup has no loss function (loss=None: the model computes its own), but the model output of type "
        f"{type(output).__name__} has no tensor `loss` (attribute or key). Pass the labels in the batch inputs, or "
        "give the Setup a loss function"
    )
