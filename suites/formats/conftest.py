"""Fixtures of the format suite: the cast under test, replaceable to prove the suite can fail."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from harness.numerics.formats import FloatFormat, cast_bits

Cast = Callable[[Sequence[float], FloatFormat, torch.device], list[int]]


@pytest.fixture
def cast_under_test() -> Cast:
    """The implementation the properties judge (the harness's own tests swap in broken ones)."""
    return cast_bits
