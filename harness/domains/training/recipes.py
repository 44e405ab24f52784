"""How a training step runs (:class:`Recipe`) and what is trained (:class:`Setup`).

A recipe names a precision, loss scaling, accumulation and clipping, or one of the deliberately
wrong variants used as negative controls; a setup is the model factory, batch function, loss,
optimizer and length. Both are frozen values: suites and users name them, the loop runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

Batch = tuple[torch.Tensor, torch.Tensor]
ModelFactory = Callable[[], nn.Module]
BatchFn = Callable[[int, torch.Generator], Batch]  # (step, generator) -> (inputs, targets)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
    control: bool = False

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
SMALL_GRAD = 2.0**-24  # gradients ~1e-3 x 2^-24 ~ 6e-11: below fp16's smallest subnormal 2^-24 ~ 6e-8
FP16_NO_SCALER = Recipe("fp16 without loss scaling", dtype=torch.float16, loss_factor=SMALL_GRAD, control=True)
FP16_WITH_SCALER_SMALL = Recipe(
    "fp16+scaler (small gradients)", dtype=torch.float16, scaler=True, loss_factor=SMALL_GRAD
)
BF16_PARAMS = Recipe("bf16 parameters, no fp32 master weights", params_dtype=torch.bfloat16, control=True)
#: Static scaling 2^16 with micro-batch gradients unscaled into fp32 buffers: passes (the twin below fails).
FP16_STATIC_FP32_ACCUM = Recipe(
    "fp16+static scale, fp32 accumulation (small gradients)",
    dtype=torch.float16,
    micro_batches=4,
    static_scale=2.0**16,
    loss_factor=SMALL_GRAD,
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
    """A training problem: model, data, loss, optimizer and length."""

    name: str
    model: Callable[[int], nn.Module]  # seed -> model
    batch: BatchFn
    loss: LossFn
    steps: int
    lr: float
    optimizer: str = "adamw"
    checkpoint_every: int = 5

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"Setup {self.name!r}: unknown optimizer {self.optimizer!r}; choose one of {', '.join(OPTIMIZERS)}"
            )

    def checkpoints(self) -> list[int]:
        return sorted({*range(self.checkpoint_every - 1, self.steps, self.checkpoint_every), self.steps - 1})


#: The optimizers a :class:`Setup` can name, and how each is built.
OPTIMIZERS: dict[str, Callable[[Sequence[nn.Parameter], float], torch.optim.Optimizer]] = {
    "sgd": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr, weight_decay=0.0),
}


def make_optimizer(kind: str, params: Sequence[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    """The optimizer a setup names; an unknown name is an error (never silently AdamW)."""
    try:
        factory = OPTIMIZERS[kind]
    except KeyError:
        raise ValueError(f"unknown optimizer {kind!r}: choose one of {', '.join(OPTIMIZERS)}") from None
    return factory(params, lr)
