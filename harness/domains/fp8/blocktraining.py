"""Block-scaled (MX, NVFP4) linears in the training suite's loop.

A model's ``nn.Linear`` modules whose in and out features are whole blocks are swapped for
:class:`BlockScaledLinear`, whose product is a :class:`~harness.domains.fp8.blocklinear.BlockLinear`'s
``mm`` (torchao's MX linear, or NVFP4 emulated over a quantiser): the rule torchao's own
conversion applies (a linear whose features are not whole blocks stays in high precision). The
others run as they would in fp32, so a setup records which linears it converted.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from harness.domains.fp8.blocklinear import BlockLinear
from harness.domains.fp8.training import FP8_PARITY_FRACTION
from harness.domains.training.recipes import Recipe, Setup
from harness.numerics import blockscaled as B
from harness.numerics.formats import FP8_E4M3FN


class BlockScaledLinear(nn.Linear):
    """An ``nn.Linear`` whose three products are ``linear.mm``'s under ``spec``; leading input
    dimensions are flattened into the batch (the weight gradient's contraction)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, linear: BlockLinear, spec: B.BlockSpec) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.block_linear = linear
        self.spec = spec

    @classmethod
    def from_linear(cls, m: nn.Linear, linear: BlockLinear, spec: B.BlockSpec) -> BlockScaledLinear:
        new = cls(m.in_features, m.out_features, m.bias is not None, linear, spec)
        new.load_state_dict(m.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        block = self.spec.block[1]
        if torch.is_grad_enabled() and rows.shape[0] % block:
            raise ValueError(
                f"{self.spec.name}: a batch of {rows.shape[0]} rows is not a whole number of {block}-element blocks "
                "along the weight gradient's contraction; use a batch (x sequence length) divisible by it"
            )
        out = self.block_linear.mm(rows, self.weight, self.spec).reshape(*x.shape[:-1], self.out_features)
        return out + self.bias if self.bias is not None else out


def convertible(m: nn.Linear, spec: B.BlockSpec) -> bool:
    """Whether both of ``m``'s feature counts are whole blocks of ``spec`` (torchao's filter)."""
    block = spec.block[1]
    return m.in_features % block == 0 and m.out_features % block == 0


def convert(model: nn.Module, linear: BlockLinear, spec: B.BlockSpec) -> list[str]:
    """Swap every convertible ``nn.Linear`` of ``model`` in place; the names of those swapped."""
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear and convertible(child, spec):
                setattr(module, child_name, BlockScaledLinear.from_linear(child, linear, spec))
                swapped.append(f"{name}.{child_name}" if name else child_name)
    return swapped


def block_recipe(spec_id: str) -> Recipe:
    """The recipe label of a block-scaled run (the loop runs it as fp32: the linears hold the casts)."""
    return Recipe(spec_id)


def block_setup(setup: Setup, spec_id: str, linear: BlockLinear) -> Setup:
    """``setup`` with its convertible linears block-scaled by ``linear`` under ``spec_id``."""
    spec = B.SPECS[spec_id]

    def model(seed: int) -> nn.Module:
        m = setup.model(seed)
        convert(m, linear, spec)
        return m

    return dataclasses.replace(setup, name=f"{setup.name}+{spec_id}", model=model)


def converted(setup: Setup, spec_id: str) -> tuple[list[str], int]:
    """Which of ``setup``'s linears a block-scaled run converts, and how many linears it has."""
    m = setup.model(0)
    total = sum(1 for x in m.modules() if type(x) is nn.Linear)
    return [n for n, x in m.named_modules() if type(x) is nn.Linear and convertible(x, B.SPECS[spec_id])], total


def parity_fraction(spec: B.BlockSpec) -> float:
    """The fraction of the fp32 seed band a block-scaled run may move the evaluation loss: float8's
    measured rule (:data:`~harness.domains.fp8.training.FP8_PARITY_FRACTION`, e4m3 and e5m2 casts)
    scaled by the element format's unit roundoff against e4m3's, as a loss perturbation is first
    order in the casts' relative error: 2 bands for MXFP8, 8 for MXFP4 and NVFP4 (e2m1's u is 4x).
    Measured false alarms and gaps: ``scripts/block_training_rates.py``, docs/fp8.md."""
    return FP8_PARITY_FRACTION * spec.elem.unit_roundoff / FP8_E4M3FN.unit_roundoff
