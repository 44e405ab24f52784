"""Fixtures of the stochastic-rounding suite: the roundings under test, replaceable to prove the
suite can fail (the harness's own tests swap in broken ones). torchao, whose optimizers' rounding
is judged by default, comes from the plugin's ``amp_torchao``, skipped with the reason where it is
missing."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest
import torch

from harness.domains.stochastic_rounding import roundings


@pytest.fixture
def stochastic_rounding_under_test(amp_torchao: ModuleType) -> Callable[[torch.Tensor], torch.Tensor]:
    """fp32 -> bf16 stochastic rounding the statistical checks judge: torchao's (its optimizers'
    ``bf16_stochastic_round``). Return your own ``(x: fp32 tensor) -> bf16 tensor`` to judge it; it
    must draw from torch's global generator (the checks seed it)."""
    return roundings.torchao_stochastic_rounding()


@pytest.fixture
def e2m1_stochastic_rounding_under_test() -> Callable[[torch.Tensor], torch.Tensor]:
    """fp32 -> e2m1 stochastic rounding (NVFP4's gradients) the statistical checks judge: the
    harness's own emulation by default (torchao's is fused into a Triton quantise kernel that needs
    a Blackwell GPU). Return your kernel's element rounding as ``(x: fp32 tensor within +-6) ->
    tensor of e2m1 values`` (a block scale of 1) to judge it; ``x`` arrives on the CPU (move it to
    your device: the result may stay there), and the rounding must draw from torch's generator on
    that device (the checks seed them all with ``torch.manual_seed``).

    Example::

        @pytest.fixture
        def e2m1_stochastic_rounding_under_test():
            return lambda x: my_nvfp4.dequantize(my_nvfp4.quantize(x.cuda(), scale=1.0, stochastic=True))
    """
    return roundings.harness_e2m1_stochastic_rounding
