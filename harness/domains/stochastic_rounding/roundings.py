"""The stochastic roundings the suite judges by default: torchao's fp32 -> bf16 (its low-precision
optimizers'), and the harness's own fp32 -> e2m1 emulation where torchao's is a GPU kernel."""

from __future__ import annotations

from collections.abc import Callable

import torch

from harness.numerics.formats import FP4_E2M1
from harness.numerics.rounding import stochastic_round_to_format
from harness.platform.thirdparty import import_third_party


def torchao_stochastic_rounding() -> Callable[[torch.Tensor], torch.Tensor]:
    """torchao's fp32 -> bf16 stochastic rounding (its low-precision optimizers'), as installed now:
    the ``stochastic_rounding_under_test`` fixture's default, and what a failure's script calls."""
    rounding: Callable[[torch.Tensor], torch.Tensor] = import_third_party("torchao.optim.quant_utils")._fp32_to_bf16_sr
    return rounding


def harness_e2m1_stochastic_rounding(x: torch.Tensor) -> torch.Tensor:
    """The harness's own fp32 -> e2m1 stochastic rounding (the NVFP4 pretraining recipe's
    emulation, :func:`harness.numerics.rounding.stochastic_round_to_format`), drawing from
    torch's global generator: the ``e2m1_stochastic_rounding_under_test`` fixture's default, so the
    CPU checks the specification itself (torchao's NVFP4 rounding is fused into a Triton kernel that
    needs a Blackwell GPU)."""
    return stochastic_round_to_format(x.to(torch.float64), FP4_E2M1, torch.default_generator)
