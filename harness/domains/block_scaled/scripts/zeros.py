"""A tensor of zeros through a block-scaled quantiser, standalone: every value it dequantises to
must be zero (an all-zero gradient, from a frozen or unused path, that comes back NaN poisons the
optimizer step).

amp-harness writes a failed check's block size and format over the defaults below and keeps the
``torchao`` block its cast takes (``MXTensor.to_mx``, or ``NVFP4Tensor.to_nvfp4`` with the
per-tensor scale ``per_tensor_amax_to_scale`` gives it; ``harness.domains.block_scaled.repro``).
As it lies here the ``stand_in`` block quantises to MXFP8 (e4m3 elements, FLOOR scales) with torch
alone.
"""

import torch

# -- parameters --
BLOCK = (1, 32)  # a block's rows and columns
MODE = "floor"  # MX: the scale calculation mode
ELEM_DTYPE = torch.float8_e4m3fn  # MX: the element format
PER_TENSOR = False  # NVFP4: with its per-tensor scale (amax / 2688)

# -- torchao_mx --


def round_trip(x: torch.Tensor) -> torch.Tensor:  # torchao's MX tensor of x, dequantised
    from torchao.prototype.mx_formats import config, mx_tensor

    t = mx_tensor.MXTensor.to_mx(x, ELEM_DTYPE, BLOCK[1], config.ScaleCalculationMode(MODE))
    out: torch.Tensor = t.dequantize(torch.float32)
    return out


# -- torchao_nvfp4 --


def round_trip(x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-redef]  # noqa: F811  (torchao's NVFP4)
    from torchao.prototype.mx_formats import nvfp4_tensor as nv

    pts = nv.per_tensor_amax_to_scale(x.abs().max()) if PER_TENSOR else None
    out: torch.Tensor = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts).dequantize(torch.float32)
    return out


# -- stand_in --


def round_trip(x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-redef]  # noqa: F811  (MXFP8 FLOOR, torch alone)
    blocks = x.reshape(-1, BLOCK[1])
    amax = blocks.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 8, 0.0)  # 448 = 1.75 x 2^8
    scale = torch.exp2(e)
    return ((blocks / scale).to(ELEM_DTYPE).float() * scale).reshape(x.shape)


# -- zeros --
x = torch.zeros(2 * BLOCK[0], 2 * BLOCK[1])
got = round_trip(x)
bad = (got != 0) | got.isnan()
if bad.any():
    print(
        f"{int(bad.sum())} of {got.numel()} values of a tensor of zeros are not zero, e.g. {got.flatten()[0].item()!r}"
    )
measured = int(bad.sum())  # values of the dequantised zeros that are not zero
allowed = 0
