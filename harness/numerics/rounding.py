"""Rounding to a float format by arithmetic alone (never a torch cast), on float64 tensors: to
nearest even, and stochastically. The emulations judged against (NVFP4's elements, e2m1 stochastic
rounding) and the references that judge a cast: one implementation of the format arithmetic."""

from __future__ import annotations

import torch

from harness.numerics.formats import FP4_E2M1, FloatFormat

#: e2m1's eight magnitudes, from its bit layout
E2M1_MAGNITUDES = torch.tensor([FP4_E2M1.decode(c) for c in range(8)], dtype=torch.float64)


def e2m1_round(p: torch.Tensor) -> torch.Tensor:
    """float64 ratios -> e2m1 codes (uint8): round to nearest, ties to the even code, saturating."""
    a = p.abs().clamp(max=FP4_E2M1.max)
    magnitudes = E2M1_MAGNITUDES.to(p.device)
    mids = (magnitudes[1:] + magnitudes[:-1]) / 2
    idx = torch.bucketize(a, mids)  # mids[i-1] < a <= mids[i] -> i
    tie = a == mids[idx.clamp(max=len(mids) - 1)]
    idx = torch.where(tie & (idx % 2 == 1), idx + 1, idx)
    sign = torch.signbit(p).to(torch.uint8) << 3
    return idx.to(torch.uint8) | sign


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) of positive float64 values, exactly (frexp: a = m 2^e with 1/2 <= m < 1)."""
    return (torch.frexp(a)[1] - 1).to(torch.float64)


def quantum_of(a: torch.Tensor, elem: FloatFormat) -> torch.Tensor:
    """The spacing of ``elem``'s values at magnitudes ``a``: 2^(max(floor(log2 a), emin) - mantissa bits)."""
    binade = floor_log2(a.clamp_min(elem.smallest_normal)).clamp_min(elem.emin)
    return torch.exp2(binade - elem.mantissa_bits)


def round_to_format(v: torch.Tensor, elem: FloatFormat) -> torch.Tensor:
    """float64 values rounded to ``elem``'s values by arithmetic alone (never a torch cast): to
    nearest, ties to even, saturating at its maximum, signs (of zeros too) kept. The quantum of a
    value is 2^(max(floor(log2|v|), emin) - mantissa bits); dividing by it is exact in float64."""
    a = v.abs()
    quantum = quantum_of(a, elem)
    r = (torch.round(a / quantum) * quantum).clamp(max=elem.max)
    return torch.copysign(r, v)


def stochastic_round_to_format(v: torch.Tensor, elem: FloatFormat, generator: torch.Generator) -> torch.Tensor:
    """float64 values rounded to one of their two neighbours in ``elem``, away from zero with
    probability equal to the distance from the lower one in units of their spacing (unbiased:
    the mean of the draws is the value), saturating at the format's maximum, signs kept."""
    a = v.abs()
    quantum = quantum_of(a, elem)
    low = torch.floor(a / quantum)
    up = torch.rand(a.shape, generator=generator, dtype=torch.float64) < (a / quantum - low)
    r = ((low + up.to(torch.float64)) * quantum).clamp(max=elem.max)
    return torch.copysign(r, v)
