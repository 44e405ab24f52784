"""A cache of training runs, each made once: the suites share fp32 seeds and AMP runs through it."""

from __future__ import annotations

import weakref

import torch

from harness.domains.engines.training.loop import Run, train
from harness.domains.engines.training.recipes import FP32, Recipe, Setup


class RunCache:
    """``cache(setup, recipe, seed, device, skip_steps, keep_states_at)``: each run once per cache (one per test
    session, held by a session fixture); ``remember`` files a run another check made (the parity
    check's AMP run, for determinism); ``fp32`` the fp32 runs of seeds 0..n-1, for a seed band."""

    def __init__(self) -> None:
        self._runs: dict[tuple[object, ...], Run] = {}

    @classmethod
    def of(cls, session: object) -> RunCache:
        """The cache of test session ``session``, one for every family's fixture: the training, the
        float8 and the block-scaled suites train the same fp32 seeds, and each run is made once in a
        session. Held only while the session lives (a later session, such as an inner run of the
        harness's own tests under a fault, starts empty)."""
        return _SESSIONS.setdefault(session, cls())

    def __call__(
        self,
        setup: Setup,
        recipe: Recipe,
        seed: int,
        device: torch.device,
        skip_steps: frozenset[int] = frozenset(),
        keep_states_at: frozenset[int] = frozenset(),
    ) -> Run:
        key = (setup, recipe, seed, str(device), skip_steps, keep_states_at)
        if key not in self._runs:
            self._runs[key] = train(setup, recipe, seed, device, skip_steps, keep_states_at=keep_states_at)
        return self._runs[key]

    def fp32(self, setup: Setup, seeds: int, device: torch.device) -> list[Run]:
        return [self(setup, FP32, s, device) for s in range(seeds)]

    def remember(self, setup: Setup, recipe: Recipe, seed: int, device: torch.device, run: Run) -> None:
        self._runs.setdefault((setup, recipe, seed, str(device), frozenset(), frozenset()), run)

    def get(self, setup: Setup, recipe: Recipe, seed: int, device: torch.device) -> Run | None:
        return self._runs.get((setup, recipe, seed, str(device), frozenset(), frozenset()))


#: each live test session's cache (:meth:`RunCache.of`)
_SESSIONS: weakref.WeakKeyDictionary[object, RunCache] = weakref.WeakKeyDictionary()
