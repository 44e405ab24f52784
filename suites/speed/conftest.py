"""Fixtures of the speed suite."""

from __future__ import annotations

import pytest


@pytest.fixture
def amp_slowdown() -> float:
    """Factor by which the AMP path is slowed (1.0: as it is; the harness's tests inject 1.3)."""
    return 1.0
