"""The toy problem every family's rank programs share: a small MLP, per-rank batches and the
gradients as lists (what a rank returns is JSON)."""

from __future__ import annotations

import torch


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def batch(rank: int, step: int = 0, n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def grads(model: torch.nn.Module) -> list[list[float]]:
    return [p.grad.detach().float().cpu().flatten().tolist() for p in model.parameters() if p.grad is not None]
