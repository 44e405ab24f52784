"""Fixtures of the training suite: one session-wide cache of training runs, so the parity, golden
curve and determinism checks share the same fp32 seeds and AMP runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from harness.domains.engines import training as T

#: fp32 seeds of the band: 8 give 28 pairs for the median (the built-in models train in 0.1-0.5 s
#: here, so seeds are cheap); the thorough tier measures more.
SEEDS = {"quick": 4, "default": 8, "thorough": 16}


@pytest.fixture(scope="session")
def seeds(pytestconfig: pytest.Config) -> int:
    return SEEDS[str(pytestconfig.getoption("--amp-tier"))]


@pytest.fixture(scope="session")
def train_cached(request: pytest.FixtureRequest) -> T.RunCache:
    """The session's training runs, each made once, shared with the float8 and the block-scaled
    suites (see :meth:`harness.domains.engines.training.RunCache.of`)."""
    return T.RunCache.of(request.session)


@pytest.fixture
def fp32_runs(train_cached, seeds, amp_device) -> Callable[[T.Setup], list[T.Run]]:
    return lambda setup: train_cached.fp32(setup, seeds, amp_device)
