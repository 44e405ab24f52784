"""Fixtures of the block-scaled suite: the MX / NVFP4 quantiser and linear under test, replaceable to
prove the suite can fail (the harness's own tests swap in broken ones). torchao comes from the
plugin's ``amp_torchao``, skipped with the reason where it is missing."""

from __future__ import annotations

from types import ModuleType

import pytest

from harness.domains.engines.training import RunCache


@pytest.fixture
def block_scaling_under_test(amp_torchao: ModuleType) -> object:
    """The MX / NVFP4 quantiser the block-scaling specifications judge (torchao's by default).

    Example, checking your own::

        @pytest.fixture
        def block_scaling_under_test():
            return MyNvfp4()     # implements harness.api.BlockScaling: unsupported() and quantize()
    """
    from harness.domains.block_scaled.blockquant import TorchaoBlockScaling

    return TorchaoBlockScaling()


@pytest.fixture
def block_linear_under_test(amp_torchao: ModuleType) -> object:
    """The block-scaled linear layer whose three products the budgets judge (torchao's MX linear,
    and NVFP4 emulated over torchao's quantiser, by default).

    Example, checking your own::

        @pytest.fixture
        def block_linear_under_test():
            return MyLinear()    # implements harness.api.BlockLinear: unsupported() and run()
            # or harness.api.EmulatedBlockLinear(MyQuantiser()) for a quantiser of your own
    """
    from harness.domains.block_scaled.blocklinear import TorchaoBlockLinear

    return TorchaoBlockLinear()


@pytest.fixture(scope="session")
def train_cached(request: pytest.FixtureRequest) -> RunCache:
    """The session's training runs, each made once: the block-scaled training checks share their
    fp32 seeds and bf16 runs with the training and the float8 checks
    (see :meth:`harness.domains.engines.training.RunCache.of`)."""
    return RunCache.of(request.session)


@pytest.fixture(scope="session")
def block_lane_references() -> dict[object, object]:
    """The block-scaled training lane's references (exact and correctly rounded steps), each made
    once per run: the accuracy and the conformance claim share them."""
    return {}
