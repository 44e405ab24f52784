"""Fixtures of the fp8 suite: the casts and the scaling code under test, replaceable to prove the
suite can fail (the harness's own tests swap in broken ones), and fp8_torchao, skipped with the reason
where it is missing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import pytest
import torch

from harness.domains.fp8 import adapters
from harness.domains.training import RunCache
from harness.numerics.formats import FloatFormat, cast_bits
from harness.platform import thirdparty

Cast = Callable[[Sequence[float], FloatFormat, torch.device], list[int]]


@pytest.fixture(scope="session")
def fp8_torchao() -> ModuleType:
    """fp8_torchao, or a skip that names what is missing (install: ``pip install amp-harness[fp8]``)."""
    missing = thirdparty.torchao_missing()
    if missing is not None:
        pytest.skip(missing)
    return thirdparty.import_third_party("torchao")


@pytest.fixture
def fp8_cast_under_test() -> Cast:
    """The fp32 -> fp8 cast the exhaustive rounding checks judge: torch's own, by default."""
    return cast_bits


@pytest.fixture
def fp8_decode_under_test() -> Callable[[str, torch.device], list[float]]:
    """(dtype name, device) -> the values of codes 0..255 as torch decodes them."""
    return adapters.torch_decode_codes


@pytest.fixture
def e8m0_cast_under_test() -> Callable[[Sequence[float], torch.device], list[int]]:
    """(fp32 values, device) -> the e8m0 codes torch casts them to."""
    return adapters.torch_e8m0_cast


@pytest.fixture
def fp8_scaling_under_test(fp8_torchao: ModuleType) -> adapters.Fp8Scaling:
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
    checks share their fp32 seeds and bf16 runs (see :meth:`harness.domains.training.RunCache.of`)."""
    return RunCache.of(request.session)
