"""Fixtures of the format suite: the cast under test, replaceable to prove the suite can fail."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from harness.formats import FloatFormat, tensor_bits, torch_dtype

Cast = Callable[[Sequence[float], FloatFormat, torch.device], list[int]]


def torch_cast(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """fp32 values cast by torch to ``fmt`` on ``device``; the result's raw bit patterns."""
    src = torch.tensor(list(values), dtype=torch.float32, device=device)
    return tensor_bits(src.to(torch_dtype(fmt)))


@pytest.fixture
def cast_under_test() -> Cast:
    """The implementation the properties judge (the harness's own tests swap in broken ones)."""
    return torch_cast
