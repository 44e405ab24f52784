"""Example: checking models defined outside the harness with the public API.

Copy this file next to your model: describe the problem as a ``harness.domains.training.Setup`` (model
factory, batch function, loss, steps, learning rate, optimizer) and hand it with the recipes to
the ``amp_training`` fixture. It runs parity against fp32 within the measured seed spread,
determinism and a gradient census, records report rows, and fails with every miss; a recipe
that tested nothing (most steps skipped, parameters unmoved) is INCONCLUSIVE, and a parity
failure names the module where the AMP run departs from fp32.

Two models: a residual MLP in the simplest form (tensor in, tensor out, a loss function), and a
model written the way real ones are (keyword inputs, BatchNorm, a dict output with its own loss,
an optimizer factory with weight decay and a learning-rate schedule), taken as it is.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.domains.engines import training as T

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
    amp_training.check(MY_PROBLEM, [T.BF16])


def test_fp16_on_my_model_is_inconclusive_where_loss_scaling_changes_nothing(amp_training, amp_device):
    """The rules are tried on the model first: fp16 without loss scaling is one of the failures a
    PASS must be told apart from, and this model's gradients are far inside fp16's range, so
    its PASS says nothing about loss scaling and is INCONCLUSIVE, with the reason."""
    with pytest.raises(AssertionError, match=r"INCONCLUSIVE(.|\n)*cannot see fp16 without loss scaling"):
        amp_training.check(MY_PROBLEM, [T.FP16_SCALER], determinism=False)


class Tagger(nn.Module):
    """Written like a library model: keyword inputs, BatchNorm, and a dict output that carries
    its own loss when labels are given (as Hugging Face models do)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, width), nn.BatchNorm1d(width), nn.ReLU(), nn.Linear(width, 3))

    def forward(
        self, features: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        logits = self.body(features * mask)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.float(), labels)
        return out


def keyword_batch(step: int, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], None]:
    """Inputs as keywords, labels among them: the model computes its own loss (targets None)."""
    x, y = batch(step, gen)
    mask = (torch.rand(x.shape[0], 8, generator=gen) > 0.1).float()
    return {"features": x, "mask": mask, "labels": y}, None


def nesterov(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)


def tagger(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return Tagger()


LIBRARY_STYLE = T.Setup(
    "tagger_bn_kwargs",
    tagger,
    keyword_batch,
    loss=None,  # the model's own: output["loss"]
    steps=30,
    lr=0.05,
    optimizer=nesterov,
    schedule=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=30),
    checkpoint_every=10,
)


def test_a_library_style_model_with_batchnorm_trains_the_same_with_amp(amp_training, amp_device):
    # what this model shows is its structures taken as they are; its gradients, like the model's
    # above, need no loss scaling, and the test above shows what the positive controls say of that
    # (power=False: not tried here)
    amp_training.check(LIBRARY_STYLE, [T.BF16, T.FP16_SCALER], census=False, power=False)
