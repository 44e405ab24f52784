"""Faults of the stochastic-rounding family: roundings that are biased, deterministic, unseeded or ignore torch's generator, into bf16 and e2m1. Each is a factory ``fault(original) -> replacement`` or a
subclass wrong in one way, named by the negative controls that inject it."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch


def sr_round_to_nearest(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's fp32 -> bf16 stochastic rounding secretly rounding to nearest: every draw a
    neighbour, none of them random (a kernel whose random bits stay zero above one half)."""

    def sr(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)

    return sr


def sr_unseeded(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's fp32 -> bf16 stochastic rounding drawing from a generator of its own, seeded
    from the operating system: unbiased and random, but a seed no longer replays it."""

    def sr(x: torch.Tensor) -> torch.Tensor:
        own = torch.Generator(device=x.device)
        own.seed()
        noise = torch.randint(0, 1 << 16, x.shape, device=x.device, dtype=torch.int32, generator=own)
        return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)  # torchao's rule

    return sr


# -- stochastic rounding (suites/stochastic_rounding/test_stochastic_rounding.py) ------------------------------------
def _sr_with(threshold: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """fp32 -> bf16 stochastic rounding, away from zero where ``threshold(shape) < low 16 bits``."""

    def rounding(x: torch.Tensor) -> torch.Tensor:
        bits = x.contiguous().view(torch.int32)
        low, toward = bits & 0xFFFF, bits & ~0xFFFF
        out = torch.where(threshold(x) < low, toward + 0x10000, toward)
        return out.view(torch.float32).bfloat16()

    return rounding


def sr_biased(bias: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """Rounds away from zero ``bias`` (a fraction of the step) more often than it should."""
    return _sr_with(lambda x: torch.randint(0, 1 << 16, x.shape, dtype=torch.int32) - int(bias * 65536))


def _unseeded(x: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, generator=g)


SR_FAULTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "round_to_nearest": lambda x: x.bfloat16(),
    "biased_an_eighth": sr_biased(1 / 8),
    "zeros": lambda x: torch.zeros_like(x, dtype=torch.bfloat16),
    "deterministic": _sr_with(lambda x: torch.full(x.shape, 1 << 15, dtype=torch.int32)),
    "ignores_the_generator": _sr_with(
        lambda x: torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, generator=torch.Generator().manual_seed(7))
    ),
    "unseeded": _sr_with(_unseeded),
}


def _e2m1_sr_with(uniform: Callable[[torch.Size], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """fp32 -> e2m1 stochastic rounding (within +-6), away from zero where ``uniform(shape)`` lies
    below the input's fraction of its step (steps 0.5 below 2, 1 below 4, 2 up to 6)."""

    def rounding(x: torch.Tensor) -> torch.Tensor:
        a = x.to(torch.float64).abs()
        step = torch.where(a < 2, 0.5, torch.where(a < 4, 1.0, 2.0)).to(torch.float64)
        low = torch.floor(a / step)
        away = uniform(a.shape) < a / step - low
        return torch.copysign(((low + away.to(torch.float64)) * step).clamp(max=6.0), x.to(torch.float64))

    return rounding


def _unseeded_uniform(shape: torch.Size) -> torch.Tensor:
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    return torch.rand(shape, dtype=torch.float64, generator=g)


def _e2m1_nearest(x: torch.Tensor) -> torch.Tensor:
    from harness.numerics.formats import FP4_E2M1
    from harness.numerics.rounding import round_to_format

    return round_to_format(x.to(torch.float64), FP4_E2M1)


#: The same faults as :data:`SR_FAULTS`, in fp32 -> e2m1 stochastic rounding ("zeros" is what one GPU
#: generation's NVFP4 rounding returned: NVIDIA/TransformerEngine PR 3281).
E2M1_SR_FAULTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "round_to_nearest": _e2m1_nearest,
    "biased_an_eighth": _e2m1_sr_with(lambda shape: torch.rand(shape, dtype=torch.float64) - 1 / 8),
    "zeros": lambda x: torch.zeros_like(x),
    "deterministic": _e2m1_sr_with(lambda shape: torch.full(shape, 0.5, dtype=torch.float64)),
    "ignores_the_generator": _e2m1_sr_with(
        lambda shape: torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    ),
    "unseeded": _e2m1_sr_with(_unseeded_uniform),
}


def torchao_sr() -> Callable[[torch.Tensor], torch.Tensor]:
    """torchao's fp32 -> bf16 stochastic rounding (the implementation the suite judges)."""
    from torchao.optim.quant_utils import _fp32_to_bf16_sr

    return _fp32_to_bf16_sr  # type: ignore[no-any-return]
