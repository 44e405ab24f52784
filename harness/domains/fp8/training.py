"""float8 linears in the training suite's loop: a setup whose linears torchao converts, and an
activation outlier (an amax spike) injected at one step.

The comparison is the training suite's (evaluation loss at each checkpoint against the fp32 seed
band), with its own fraction. fp8's unit roundoff is 2^4 times bf16's, and float8 training does not
meet bf16's rule (half the band); how far it departs is recorded beside every verdict as a finding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from harness.domains.engines.scaled.localise import Localised, fp32_state_at
from harness.domains.engines.training.recipes import INIT_SEED, Batch, BatchFn, Recipe, Setup, to_device
from harness.domains.fp8 import linear
from harness.platform.thirdparty import import_third_party

#: the activation outlier: one sample's inputs multiplied by this at the spike step, so that the
#: step's tensorwise amax is set by one sample (the others lose log2(8) = 3 binades of range,
#: e4m3's 3 mantissa bits stay); fp32 takes the same spiked batch
OUTLIER_FACTOR = 8.0


def float8_recipe(name: str) -> Recipe:
    """The recipe label of a float8 run (the loop runs it as fp32: the linears hold the fp8 casts)."""
    return Recipe(f"float8 {name}")


def scaled_mm_shapes(module: nn.Module, _fqn: str) -> bool:
    """Whether a Linear can run on ``torch._scaled_mm``: both dimensions multiples of 16, cuBLASLt's
    requirement (torchao's README filters the same way). Applied on every device, so that the CPU's
    emulated run converts the same layers as the GPU's; a narrow head (a regression's 1 output)
    stays in high precision, as in float8 recipes for real models."""
    return all(getattr(module, d, 0) % 16 == 0 for d in ("in_features", "out_features"))


def float8_setup(setup: Setup, recipe_name: str, emulate: bool = False) -> Setup:
    """``setup`` with every nn.Linear converted by torchao's ``convert_to_float8_training`` for the
    named recipe. ``emulate``: torchao's emulated matmul (the same fp8 casts, products in fp32), for
    CPUs whose fp8 kernels are too slow for a training run."""
    float8 = import_third_party("torchao.float8")
    config = float8.Float8LinearConfig.from_recipe_name(recipe_name)
    if emulate:
        config = dataclasses.replace(config, emulate=True)

    def model(seed: int) -> nn.Module:
        m = setup.model(seed)
        float8.convert_to_float8_training(m, module_filter_fn=scaled_mm_shapes, config=config)
        return m

    return dataclasses.replace(setup, name=f"{setup.name}+float8-{recipe_name}", model=model)


def with_outlier(setup: Setup, step: int, factor: float = OUTLIER_FACTOR) -> Setup:
    """``setup`` whose batch at ``step`` has its first sample's inputs multiplied by ``factor``."""
    inner: BatchFn = setup.batch

    def batch(t: int, gen: torch.Generator) -> Batch:
        x, y = inner(t, gen)
        if t == step and isinstance(x, torch.Tensor) and x.is_floating_point():
            x = x.clone()
            x[0] = x[0] * factor
        return x, y

    return dataclasses.replace(setup, name=f"{setup.name}+outlier@{step}", batch=batch)


def convertible_linears(model: nn.Module) -> tuple[int, int]:
    """How many of a model's nn.Linear layers :func:`scaled_mm_shapes` lets float8 convert, and how many it holds."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return sum(scaled_mm_shapes(m, "") for m in linears), len(linears)


def linear_count(model: Any) -> int:
    """How many Float8Linear modules a converted model holds (a conversion that did nothing is vacuous)."""
    return sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")


def first_linear_over_budget(
    setup: Setup,
    recipe_name: str,
    failed_step: int,
    device: torch.device | str = "cpu",
    emulate: bool = False,
) -> tuple[Localised | None, int]:
    """Localise a float8 run that left its band: at ``failed_step`` (:func:`fp32_state_at`), one
    step of ``setup`` with its linears converted for ``recipe_name``; the first linear whose
    Float8Linear products leave their budget, with its script
    (:func:`harness.domains.fp8.linear.first_linear_over_budget`), and how many were judged."""

    dev = torch.device(device)
    weights, batch = fp32_state_at(setup, failed_step, dev)
    model = float8_setup(setup, recipe_name, emulate).model(INIT_SEED).to(dev)
    model.load_state_dict(weights)
    inputs, targets = to_device(batch, dev)
    return linear.first_linear_over_budget(
        recipe_name, model, lambda: setup.loss_on(model, inputs, targets), dev, emulate
    )
