"""How a training step runs (:class:`Recipe`) and what is trained (:class:`Setup`).

A recipe names a precision, loss scaling, accumulation and clipping, or one of the deliberately
wrong variants used as negative controls; a setup is the model factory, batch function, loss,
optimizer and length. Both are frozen values: suites and users name them, the loop runs them.

Batches and model outputs of any structure: how the training loop calls a model it did not
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

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn


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


#: Models start from one initialisation; seeds vary the data stream. The seed band is then the
#: run-to-run noise of the data order, the spread a practitioner sees re-running the same model.
INIT_SEED = 0
#: Training data of seed s is drawn from generator seed DATA_SEED_OFFSET + s: apart from the
#: initialisation seeds and from the evaluation batch's seed.
DATA_SEED_OFFSET = 10_000
#: Seed of the fixed evaluation batch (never used for training data).
EVAL_SEED = 99_999

#: (inputs, targets): inputs a tensor, tuple/list (positional), dict (keyword) or Inputs; targets
#: any structure of tensors, or None where the model computes its own loss (see batches.py)
Batch = tuple[Any, Any]
ModelFactory = Callable[[], nn.Module]
BatchFn = Callable[[int, torch.Generator], Batch]  # (step, generator) -> (inputs, targets)
LossFn = Callable[[torch.Tensor, Any], torch.Tensor]  # (output tensor in fp32, targets) -> loss
#: (parameters, learning rate) -> optimizer: any optimizer, configured as you train
OptimizerFactory = Callable[[list[nn.Parameter], float], torch.optim.Optimizer]
#: optimizer -> learning-rate scheduler, stepped once per training step (taken or skipped)
ScheduleFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]
#: device type -> the loss scaler of a recipe with one: torch.amp.GradScaler or a subclass (your own)
ScalerFactory = Callable[[str], torch.amp.GradScaler]


def metric_id(name: str) -> str:
    """A recipe's name as it appears in metric names: letters, digits and ``_.+-`` only."""
    return re.sub(r"[^A-Za-z0-9_.+\-]+", "_", name).strip("_")


@dataclass(frozen=True)
class Recipe:
    """How one training step runs. ``control`` names a deliberately wrong variant."""

    name: str
    dtype: torch.dtype | None = None  # autocast dtype; None = fp32
    scaler: bool = False
    micro_batches: int = 1
    clip: float | None = None
    params_dtype: torch.dtype | None = None  # control: parameters (and optimizer) in low precision
    grad_accum_dtype: torch.dtype | None = None  # control: micro-batch gradients summed in this dtype
    loss_factor: float = 1.0  # small-gradient regime: loss x factor, lr / factor (SGD: same training in exact math)
    static_scale: float | None = None  # static loss scaling (Micikevicius et al.): loss x S, gradients / S
    #: fault injection for measuring detection: every gradient element x (1 + grad_noise x N(0, 1))
    grad_noise: float | None = None
    #: which noise stream (members of a perturbation ensemble differ here, not in their data)
    noise_seed: int = 0
    #: a correctly rounded recipe emulated in float64 (:mod:`harness.domains.engines.training.emulation`):
    #: the low-precision functions round to this dtype, stochastically (stream ``noise_seed``)
    emulate: torch.dtype | None = None
    control: bool = False

    @property
    def metric_id(self) -> str:
        """The name as it appears in metric names: letters, digits and ``_.+-`` only."""
        return metric_id(self.name)

    def fp32_counterpart(self) -> Recipe:
        """The fp32 run this recipe must match: same accumulation, clipping and loss factor."""
        return Recipe(
            f"fp32[{self.name}]", micro_batches=self.micro_batches, clip=self.clip, loss_factor=self.loss_factor
        )


FP32 = Recipe("fp32")
BF16 = Recipe("bf16", dtype=torch.bfloat16)
FP16_SCALER = Recipe("fp16+scaler", dtype=torch.float16, scaler=True)
ACCUM4 = Recipe("fp16+scaler+accum4", dtype=torch.float16, scaler=True, micro_batches=4)
CLIP = Recipe("fp16+scaler+clip", dtype=torch.float16, scaler=True, clip=0.5)
#: Negative controls (Micikevicius et al. 2018 and the source text's pitfalls): each must fail parity.
SMALL_GRAD = (
    2.0**-16
)  # gradients ~1e-3 x 2^-16 ~ 1.5e-8: below fp16's smallest subnormal 2^-24 ~ 6e-8; x 2^16 normal again
FP16_NO_SCALER = Recipe("fp16 without loss scaling", dtype=torch.float16, loss_factor=SMALL_GRAD, control=True)
FP16_WITH_SCALER_SMALL = Recipe(
    "fp16+scaler (small gradients)", dtype=torch.float16, scaler=True, loss_factor=SMALL_GRAD
)
BF16_PARAMS = Recipe("bf16 parameters, no fp32 master weights", params_dtype=torch.bfloat16, control=True)
#: Gradients ~1e-3 x 2^-24 ~ 6e-11, far below fp16's smallest subnormal, for the accumulation pair:
#: static scaling 2^24 brings them back to ~1e-3 (normal: a correctly sized static scale, which the
#: AMP lane requires; 2^16 would leave them subnormal, 2.8x a correctly scaled step's error).
TINY_GRAD = 2.0**-24
#: Static scaling with micro-batch gradients unscaled into fp32 buffers: passes (the twin below fails).
FP16_STATIC_FP32_ACCUM = Recipe(
    "fp16+static scale, fp32 accumulation (small gradients)",
    dtype=torch.float16,
    micro_batches=4,
    static_scale=2.0**24,
    loss_factor=TINY_GRAD,
)
#: The same recipe with one fault: the micro-batch gradient buffers are fp16.
FP16_GRAD_ACCUM = replace(
    FP16_STATIC_FP32_ACCUM,
    name="gradients accumulated in fp16 (small gradients)",
    grad_accum_dtype=torch.float16,
    control=True,
)
#: The source text's advice for pitfall 2 ("accumulate in fp32 or use bf16"): bf16 buffers over 16 micro-batches.
BF16_GRAD_ACCUM = Recipe(
    "gradients accumulated in bf16 (16 micro-batches)",
    dtype=torch.bfloat16,
    micro_batches=16,
    grad_accum_dtype=torch.bfloat16,
)


@dataclass(frozen=True)
class Setup:
    """A training problem: model, data, loss, optimizer and length.

    ``loss`` takes the output tensor (``output(model_output)``, in fp32 or wider) and the targets; None means
    the model computes its own (``.loss`` / ``["loss"]`` of its output, labels in the inputs).
    ``optimizer`` is a name from :data:`OPTIMIZERS` or a factory ``(params, lr) -> Optimizer``;
    ``weight_decay`` applies to the named ones; ``schedule`` builds an LR scheduler; ``scaler``
    builds the loss scaler of the recipes with one (default ``torch.amp.GradScaler(device)``).
    """

    name: str
    model: Callable[[int], nn.Module]  # seed -> model
    batch: BatchFn
    loss: LossFn | None
    steps: int
    lr: float
    optimizer: str | OptimizerFactory = "adamw"
    checkpoint_every: int = 5
    weight_decay: float = 0.0
    schedule: ScheduleFactory | None = None
    output: Callable[[Any], torch.Tensor] = logits_of
    scaler: ScalerFactory | None = None

    def __post_init__(self) -> None:
        if isinstance(self.optimizer, str):
            if self.optimizer not in OPTIMIZERS:
                raise ValueError(
                    f"Setup {self.name!r}: unknown optimizer {self.optimizer!r}; choose one of "
                    f"{', '.join(OPTIMIZERS)}, or pass a factory (params, lr) -> torch.optim.Optimizer"
                )
        elif not callable(self.optimizer):
            raise TypeError(f"Setup {self.name!r}: optimizer must be a name or a callable (params, lr) -> Optimizer")
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ValueError(f"Setup {self.name!r}: steps and checkpoint_every must be >= 1")

    def checkpoints(self) -> list[int]:
        return sorted({*range(self.checkpoint_every - 1, self.steps, self.checkpoint_every), self.steps - 1})

    @property
    def plain_sgd(self) -> bool:
        """SGD by name: the only optimizer where loss x k with lr / k is the same training."""
        return self.optimizer == "sgd"

    def make_optimizer(self, params: Sequence[nn.Parameter], lr: float) -> torch.optim.Optimizer:
        if isinstance(self.optimizer, str):
            return make_optimizer(self.optimizer, params, lr, self.weight_decay)
        return self.optimizer(list(params), lr)

    def make_scaler(self, device_type: str) -> torch.amp.GradScaler:
        """The loss scaler of a recipe with one: yours, or torch's GradScaler with its defaults."""
        return torch.amp.GradScaler(device_type) if self.scaler is None else self.scaler(device_type)

    def build(self, device: torch.device | str, seed: int = INIT_SEED) -> nn.Module:
        """The model every run of this setup starts from, on ``device``."""
        return self.model(seed).to(torch.device(device))

    def eval_batch(self, device: torch.device | str) -> tuple[Any, Any]:
        """The fixed evaluation batch (inputs, targets), on ``device``: never a training batch."""
        inputs, targets = to_device(self.batch(0, torch.Generator().manual_seed(EVAL_SEED)), torch.device(device))
        return inputs, targets

    def loss_on(self, model: nn.Module, inputs: Any, targets: Any) -> torch.Tensor:
        """Call the user's model on a batch and get its loss: the one place that does it (parity,
        the lane, the census, the diagnosis, fp8 training all go through here)."""
        return self.loss_from(self.forward(model, inputs), targets)

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        """The model's raw output for batch inputs of any structure."""
        return call(model, inputs)

    def loss_from(self, output: Any, targets: Any) -> torch.Tensor:
        """The loss of a model output: the Setup's loss on the output tensor in fp32, or the model's own."""
        if self.loss is None:
            return _at_least_fp32(loss_of(output))
        return self.loss(_at_least_fp32(self.output(output)), targets)


def _at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """Low-precision outputs upcast to fp32; fp64 kept (the fp64 reference trajectory)."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


#: The optimizers a :class:`Setup` can name, and how each is built: (params, lr, weight decay).
OPTIMIZERS: dict[str, Callable[[Sequence[nn.Parameter], float, float], torch.optim.Optimizer]] = {
    "sgd": lambda params, lr, wd: torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=wd),
    "adamw": lambda params, lr, wd: torch.optim.AdamW(params, lr=lr, weight_decay=wd),
    "adam": lambda params, lr, wd: torch.optim.Adam(params, lr=lr, weight_decay=wd),
}


def make_optimizer(
    kind: str, params: Sequence[nn.Parameter], lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """The optimizer a setup names; an unknown name is an error (never silently AdamW)."""
    try:
        factory = OPTIMIZERS[kind]
    except KeyError:
        raise ValueError(
            f"unknown optimizer {kind!r}: choose one of {', '.join(OPTIMIZERS)}, or pass a factory "
            "(params, lr) -> torch.optim.Optimizer as Setup(optimizer=...)"
        ) from None
    return factory(params, lr, weight_decay)
