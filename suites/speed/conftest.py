"""The speed suite's seams: what its negative controls swap (by ``module:function`` name where
spawned ranks import it)."""

from __future__ import annotations

import pytest


@pytest.fixture
def allreduce_timed() -> str:
    """The all-reduce whose bus bandwidth is measured."""
    return "torch.distributed:all_reduce"
