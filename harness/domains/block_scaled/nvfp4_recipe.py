"""NVFP4 as NVIDIA's pretraining recipe trains a linear layer, emulated on the harness's quantiser.

Beyond the NVFP4 cast itself (e2m1 elements, e4m3 scales per 16, a float32 scale per tensor), the
recipe (NVIDIA's "Pretraining Large Language Models with NVFP4", TransformerEngine's
``NVFP4BlockScaling``, torchao's NVFP4 training tracker, pytorch/ao#3293) adds three measures, each
of which it can switch off:

* **16x16 weight tiles**: one scale per 16x16 tile of the weight, so the same quantised weight
  serves the forward product (blocks along in_features) and the input gradient (along
  out_features): forward and backward see one weight;
* **stochastic rounding of gradients**: the output gradient's elements, in both gradient
  products, are rounded up or down at random, unbiased (activations and weights to nearest);
* **a random Hadamard transform on the weight gradient's inputs**: both operands of ``g^T @ x``
  are multiplied along the batch, in blocks of 16, by the same orthogonal matrix (Sylvester's
  16x16 Hadamard / 4 with a random sign per column), which leaves the exact product unchanged and
  spreads outliers over their block before the cast.

torchao implements these as Triton kernels for Blackwell GPUs (SM100+) only; here each is plain torch over
:class:`~harness.domains.block_scaled.blockquant.TorchBlockScaling` (checked against the exact reference),
products of dequantised operands in float32. What a run costs against fp32 and bf16, with each
measure on or off, is the recipe's envelope (docs/fp8.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.block_scaled.blockquant import TorchBlockScaling
from harness.numerics import blockscaled as B

#: the recipe's block: NVFP4's 16 elements per scale, and the Hadamard transform's size
BLOCK = 16


def hadamard(n: int = BLOCK) -> torch.Tensor:
    """Sylvester's n x n Hadamard matrix divided by sqrt(n): orthogonal, entries +-1/sqrt(n)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    scaled: torch.Tensor = h / h.shape[0] ** 0.5
    return scaled


@dataclass(frozen=True)
class NVFP4Recipe:
    """Which of the pretraining recipe's measures are on (all, by default: the recipe as published)."""

    weight_tiles: bool = True
    stochastic_gradients: bool = True
    hadamard: bool = True

    def describe(self) -> str:
        on = [
            name
            for name, flag in (
                ("16x16 weight tiles", self.weight_tiles),
                ("stochastic rounding of gradients", self.stochastic_gradients),
                ("Hadamard transform on wgrad inputs", self.hadamard),
            )
            if flag
        ]
        return ", ".join(on) if on else "plain 1x16 casts"


class NVFP4RecipeLinear:
    """A :class:`~harness.domains.block_scaled.blocklinear.BlockLinear` running ``recipe``; ``seed`` draws
    its Hadamard signs and its stochastic roundings (a run is repeatable from its seed)."""

    def __init__(self, recipe: NVFP4Recipe | None = None, seed: int = 0) -> None:
        self.recipe = recipe or NVFP4Recipe()
        self.name = f"NVFP4 recipe ({self.recipe.describe()})"
        self.generator = torch.Generator().manual_seed(seed)
        signs = torch.randint(0, 2, (BLOCK,), generator=self.generator, dtype=torch.float64) * 2 - 1
        self.rotation = hadamard() * signs  # H diag(s): orthogonal
        self._quantiser = TorchBlockScaling()

    def unsupported(self, spec: B.BlockSpec) -> str | None:
        if spec.name != "nvfp4":
            return f"the NVFP4 recipe casts as nvfp4 (two-level, 1x16; weights in 16x16 tiles), not {spec.name}"
        return None

    def cast(self, a: torch.Tensor, spec_id: str, stochastic: bool = False) -> torch.Tensor:
        """``a`` quantised in blocks along its last dimension (tiles: 16x16), dequantised."""
        gen = self.generator if stochastic else None
        q = self._quantiser.quantize(a.detach().float().contiguous(), B.SPECS[spec_id], gen)
        return q.values.to(a.dtype)

    def weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The quantised weight along in_features (forward) and along out_features (input gradient)."""
        if self.recipe.weight_tiles:
            tiled = self.cast(w, "nvfp4-2d")
            return tiled, tiled
        return self.cast(w, "nvfp4"), self.cast(w.T, "nvfp4").T

    def rotate(self, a: torch.Tensor) -> torch.Tensor:
        """``a`` (rows x batch) times the block-diagonal rotation along the batch (the identity
        without the Hadamard transform): ``rotate(g^T) @ rotate(x^T)^T == g^T @ x`` exactly."""
        if not self.recipe.hadamard:
            return a
        rows, batch = a.shape
        r = self.rotation.to(a.dtype)
        return (a.reshape(rows, batch // BLOCK, BLOCK) @ r).reshape(rows, batch)

    def mm(self, x: torch.Tensor, w: torch.Tensor, spec: B.BlockSpec) -> torch.Tensor:
        out: torch.Tensor = _RecipeMM.apply(x, w, self)  # type: ignore[no-untyped-call]
        return out


class _RecipeMM(torch.autograd.Function):
    """``x @ w^T`` and its two gradient products under an :class:`NVFP4RecipeLinear`'s recipe."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, lin: NVFP4RecipeLinear) -> torch.Tensor:
        along_in, along_out = lin.weight(w)
        ctx.save_for_backward(x, along_out)
        ctx.lin = lin
        return lin.cast(x, "nvfp4") @ along_in.T

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, along_out = ctx.saved_tensors
        lin: NVFP4RecipeLinear = ctx.lin
        sr = lin.recipe.stochastic_gradients
        grad_input = lin.cast(g, "nvfp4", sr) @ along_out
        grad_weight = lin.cast(lin.rotate(g.T), "nvfp4", sr) @ lin.cast(lin.rotate(x.T), "nvfp4").T
        return grad_input, grad_weight, None
