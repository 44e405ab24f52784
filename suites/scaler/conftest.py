"""Fixtures of the loss-scaler suite: the scaler class under test, replaceable to prove the suite
can fail (the harness's own tests swap in deliberately broken scalers)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def scaler_factory() -> type[torch.amp.GradScaler]:
    """The GradScaler implementation the suite judges."""
    return torch.amp.GradScaler
