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


class RunCache:
    """``train_cached(setup, recipe, seed, device, skip_steps)``: each run once per session;
    ``remember`` files a run another check made (the parity check's AMP run, for determinism)."""

    def __init__(self) -> None:
        self._runs: dict[tuple[object, ...], T.Run] = {}

    def __call__(
        self,
        setup: T.Setup,
        recipe: T.Recipe,
        seed: int,
        device: torch.device,
        skip_steps: frozenset[int] = frozenset(),
    ) -> T.Run:
        key = (setup, recipe, seed, str(device), skip_steps)
        if key not in self._runs:
            self._runs[key] = T.train(setup, recipe, seed, device, skip_steps)
        return self._runs[key]

    def remember(self, setup: T.Setup, recipe: T.Recipe, seed: int, device: torch.device, run: T.Run) -> None:
        self._runs.setdefault((setup, recipe, seed, str(device), frozenset()), run)

    def get(self, setup: T.Setup, recipe: T.Recipe, seed: int, device: torch.device) -> T.Run | None:
        return self._runs.get((setup, recipe, seed, str(device), frozenset()))


@pytest.fixture(scope="session")
def train_cached() -> RunCache:
    """The session's training runs, each made once (see :class:`RunCache`)."""
    return RunCache()


@pytest.fixture
def fp32_runs(train_cached, seeds, amp_device) -> Callable[[T.Setup], list[T.Run]]:
    return lambda setup: [train_cached(setup, T.FP32, s, amp_device) for s in range(seeds)]
