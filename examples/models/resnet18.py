"""ResNet-18 in plain torch (torchvision's BasicBlock layout: 64-128-256-512, two blocks per stage,
BatchNorm after every convolution), for 10 classes on 32x32 images, and a Setup the harness can
train. torchvision's own resnet18 has the same structure; it is written out here because PyPI's
torchvision does not import beside the CPU build of torch this project pins.

    from harness.domains.engines import training as T
    from examples.models.resnet18 import RESNET18_SETUP
    T.check_parity(RESNET18_SETUP, [T.BF16])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.domains.engines import training as T


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


_PROTOTYPES = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(7))


def batch(step: int, gen: torch.Generator, size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Ten noisy class prototypes: learnable in a few steps, no download."""
    y = torch.randint(0, 10, (size,), generator=gen)
    return _PROTOTYPES[y] + 0.5 * torch.randn(size, 3, 32, 32, generator=gen), y


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return ResNet18()


RESNET18_SETUP = T.Setup("resnet18", model, batch, F.cross_entropy, steps=10, lr=1e-3, checkpoint_every=5)
