"""Example: checking a model defined outside the harness with the public API.

Copy this file next to your model: describe the problem as a ``harness.domains.training.Setup`` (model
factory, batch function, loss, steps, learning rate, optimizer) and hand it with the recipes to
the ``amp_training`` fixture. It runs parity against fp32 within the measured seed spread,
determinism and a gradient census, records report rows, and fails with every miss.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.domains import training as T

pytestmark = pytest.mark.amp_capability("training parity")


class ResidualMLP(nn.Module):
    """A model the harness knows nothing about: residual blocks with LayerNorm."""

    def __init__(self, width: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.SiLU()) for _ in range(blocks)
        )
        self.out = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


CENTRES = torch.randn(3, 8, generator=torch.Generator().manual_seed(5)) * 2


def batch(step: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Three Gaussian clusters to classify."""
    y = torch.randint(0, 3, (48,), generator=gen)
    return CENTRES[y] + torch.randn(48, 8, generator=gen), y


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ResidualMLP()


MY_PROBLEM = T.Setup("residual_mlp", model, batch, nn.functional.cross_entropy, steps=30, lr=3e-3, checkpoint_every=10)


def test_my_model_trains_the_same_with_amp(amp_training, amp_device):
    amp_training.check(MY_PROBLEM, [T.BF16, T.FP16_SCALER])
