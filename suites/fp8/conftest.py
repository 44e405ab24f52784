"""Fixtures of the fp8 suite: the casts and the scaling code under test, replaceable to prove the
suite can fail (the harness's own tests swap in broken ones). torchao comes from the plugin's
``amp_torchao``, skipped with the reason where it is missing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import pytest
import torch

from harness.domains.engines.training import RunCache
from harness.domains.fp8 import adapters
from harness.numerics.formats import FloatFormat

Cast = Callable[[Sequence[float], FloatFormat, torch.device], list[int]]


@pytest.fixture
def fp8_decode_under_test() -> Callable[[str, torch.device], list[float]]:
    """(dtype name, device) -> the values of codes 0..255 as torch decodes them."""
    return adapters.torch_decode_codes


@pytest.fixture
def e8m0_cast_under_test() -> Callable[[Sequence[float], torch.device], list[int]]:
    """(fp32 values, device) -> the e8m0 codes torch casts them to."""
    return adapters.torch_e8m0_cast


@pytest.fixture
def fp8_scaling_under_test(amp_torchao: ModuleType) -> adapters.Fp8Scaling:
    """The fp8 scaling code the recipe specifications judge (torchao's by default).

    Example, checking your own::

        @pytest.fixture
        def fp8_scaling_under_test():
            return MyScaling()     # implements harness.api.Fp8Scaling: scale() and cast()
    """
    return adapters.TorchaoScaling()


@pytest.fixture
def float8_fsdp_shard() -> str:
    """FSDP2's sharding function for the float8 all-gather check, as ``"module:function"`` (each
    rank imports it): torch's ``fully_shard`` by default."""
    return "torch.distributed.fsdp:fully_shard"


@pytest.fixture
def delayed_scaling_under_test() -> Callable[..., object]:
    """(DelayedConfig) -> the delayed-scaling recipe the specification judges: the harness's own in
    plain torch by default. Return a factory of your adapter
    (``harness.api.DelayedScalingAdapter``: TransformerEngine's where it is installed) to judge it."""
    from harness.domains.fp8.delayed import TorchDelayedScaling

    return TorchDelayedScaling


@pytest.fixture(scope="session")
def train_cached(request: pytest.FixtureRequest) -> RunCache:
    """The session's training runs, each made once: the training, the float8 and the block-scaled
    checks share their fp32 seeds and bf16 runs (see :meth:`harness.domains.engines.training.RunCache.of`)."""
    return RunCache.of(request.session)
