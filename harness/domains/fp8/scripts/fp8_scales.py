"""An fp8 scaling recipe's scales, standalone, against their definition: fp8_max / max(amax,
1e-12) in float64, rounded once to float32 (with ``POWER_OF_2``, the largest power of two not
above it, from the bits); per tensor or along an axis.

amp-harness writes a failed check's tensor and values over the defaults below and keeps the
``torchao`` block (its ``float8_utils.tensor_to_scale``, imported where it is called;
``harness.domains.fp8.repro.fp8_scales``). As it lies here the ``stand_in`` block computes the
scales in float32 with torch, as a recipe would.
"""

import math

import torch

# -- inputs --
x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0)) * 3.0

# -- parameters --
FP8_DTYPE = torch.float8_e4m3fn  # the fp8 format
FP8_MAX = 448.0  # the format's largest finite value
AXIS: int | None = None  # None: one scale per tensor; else along this axis
POWER_OF_2 = False  # scales rounded down to a power of two

# -- torchao --


def scales(x: torch.Tensor) -> torch.Tensor:  # torchao's scales of x
    from torchao.float8 import config, float8_utils

    granularity = config.ScalingGranularity.TENSORWISE if AXIS is None else config.ScalingGranularity.AXISWISE
    got: torch.Tensor = float8_utils.tensor_to_scale(
        x, FP8_DTYPE, scaling_granularity=granularity, axiswise_dim=AXIS, round_scales_to_power_of_2=POWER_OF_2
    )
    return got


# -- stand_in --


def scales(x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-redef]  # noqa: F811  (float32, as a recipe would)
    amax = x.abs().max() if AXIS is None else x.abs().amax(dim=AXIS, keepdim=True)
    amax = torch.clamp(amax.float(), min=1e-12)
    scale = torch.full_like(amax, FP8_MAX) / amax  # one rounding (a Python number over a tensor: two)
    return torch.exp2(torch.floor(torch.log2(scale))) if POWER_OF_2 else scale


# -- judgement --
got = scales(x)
# reference: the definition, in float64 (amax of a float32 tensor is exact)
amax64 = x.double().abs().max() if AXIS is None else x.double().abs().amax(dim=AXIS, keepdim=True)
exact = FP8_MAX / torch.clamp(amax64, min=1e-12)  # inf amax: 0; NaN: NaN
ref = exact.float()  # rounded once more to float32: as rounding the exact quotient once (53 >= 2 x 24 + 2)
if POWER_OF_2:  # the power of two at or below it
    below = [math.ldexp(1.0, math.frexp(v)[1] - 1) if 0 < v < math.inf else v for v in ref.flatten().tolist()]
    ref = torch.tensor(below).reshape(ref.shape)
pairs = list(zip(got.float().flatten().tolist(), ref.flatten().tolist(), strict=False))
differ = [(i, g_, r_) for i, (g_, r_) in enumerate(pairs) if g_ != r_ and not (g_ != g_ and r_ != r_)]
for i, g_, r_ in differ:
    print(f"scale {i}: under test {g_!r}, by definition {r_!r}")
measured = len(differ) if got.numel() == ref.numel() else math.inf  # scales unlike their definition
allowed = 0
