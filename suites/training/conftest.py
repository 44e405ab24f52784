"""Fixtures of the training suite: one session-wide cache of training runs, so the parity, golden
curve and determinism checks share the same fp32 seeds and AMP runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from harness.domains import training as T

#: fp32 seeds of the band: 8 give 28 pairs for the median (the built-in models train in 0.1-0.5 s
#: here, so seeds are cheap); the thorough tier measures more.
SEEDS = {"quick": 4, "default": 8, "thorough": 16}


@pytest.fixture(scope="session")
def seeds(pytestconfig: pytest.Config) -> int:
    return SEEDS[str(pytestconfig.getoption("--amp-tier"))]


@pytest.fixture(scope="session")
def train_cached() -> Callable[..., T.Run]:
    """``train_cached(setup, recipe, seed, device, skip_steps)``: each run once per session."""
    cache: dict[tuple[object, ...], T.Run] = {}

    def run(
        setup: T.Setup, recipe: T.Recipe, seed: int, device: torch.device, skip_steps: frozenset[int] = frozenset()
    ) -> T.Run:
        key = (setup, recipe, seed, str(device), skip_steps)
        if key not in cache:
            cache[key] = T.train(setup, recipe, seed, device, skip_steps)
        return cache[key]

    return run


@pytest.fixture
def fp32_runs(train_cached, seeds, amp_device) -> Callable[[T.Setup], list[T.Run]]:
    return lambda setup: [train_cached(setup, T.FP32, s, amp_device) for s in range(seeds)]
