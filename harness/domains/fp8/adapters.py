"""The fp8 scaling code under test: torchao's, or a user's own through :class:`Fp8Scaling`.

The scaling suite asks an adapter two things per operand spec (:class:`~harness.numerics.scaled.CastSpec`):
the float32 scales of a 2-D tensor, and the fp8 tensor it casts with them. It compares both with
the exact reference bit for bit. A user's own fp8 code is checked by returning an adapter from the
``fp8_scaling_under_test`` fixture, as a user's loss scaler is checked through ``ScalerAdapter``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from harness.numerics.formats import torch_dtype
from harness.numerics.scaled import CastSpec, Granularity
from harness.platform.thirdparty import import_third_party


class Fp8Scaling(Protocol):
    """What fp8 scaling code implements to be judged against the spec.

    ``scale``: float32 scales of the 2-D tensor ``x`` for ``spec``, shaped to broadcast against it:
    ``()`` tensorwise, ``(rows, 1)`` for axis -1, ``(1, cols)`` for axis 0.
    ``cast``: ``x`` multiplied by ``scale`` and cast to ``spec.fmt`` (an fp8 tensor of x's shape).

    Example, for a recipe of your own::

        class MyScaling:
            name = "mine"
            def scale(self, x, spec): return my_fp8.compute_scale(x, spec.fmt.name, dim=spec.axis)
            def cast(self, x, scale, spec): return my_fp8.quantize(x, scale)

        @pytest.fixture
        def fp8_scaling_under_test():
            return MyScaling()
    """

    name: str

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor: ...

    def cast(self, x: torch.Tensor, scale: torch.Tensor, spec: CastSpec) -> torch.Tensor: ...


def torch_decode_codes(dtype_name: str, device: torch.device) -> list[float]:
    """torch's values of codes 0..255 of an 8-bit float dtype (viewed from uint8, to float32): the
    decoding the format checks judge by default, and the one a reproduction script can run."""
    codes = torch.arange(256, dtype=torch.uint8, device=device)
    return [float(v) for v in codes.view(getattr(torch, dtype_name)).to(torch.float32).cpu().tolist()]


def torch_e8m0_cast(values: Sequence[float], device: torch.device) -> list[int]:
    """torch's float32 -> e8m0 cast of ``values``, as codes: the cast the e8m0 checks judge by
    default, and the one a reproduction script can run."""
    t = torch.tensor(list(values), dtype=torch.float32, device=device).to(torch.float8_e8m0fnu)
    return [int(c) for c in t.view(torch.uint8).cpu().tolist()]


class TorchaoScaling:
    """torchao's dynamic scaling: ``tensor_to_scale`` and ``hp_tensor_and_scale_to_float8``, the two
    calls its Float8Linear makes for every operand."""

    name = "torchao"

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        utils = import_third_party("torchao.float8.float8_utils")
        config = import_third_party("torchao.float8.config")
        tensorwise = spec.granularity is Granularity.TENSOR
        granularity = config.ScalingGranularity.TENSORWISE if tensorwise else config.ScalingGranularity.AXISWISE
        s: torch.Tensor = utils.tensor_to_scale(
            x,
            torch_dtype(spec.fmt),
            scaling_granularity=granularity,
            axiswise_dim=None if tensorwise else spec.axis,
            round_scales_to_power_of_2=spec.power_of_2,
        )
        return s

    def cast(self, x: torch.Tensor, scale: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        tensor = import_third_party("torchao.float8.float8_training_tensor")
        axis = None if spec.granularity is Granularity.TENSOR else spec.axis
        t = tensor.hp_tensor_and_scale_to_float8(x, scale, torch_dtype(spec.fmt), axiswise_dim=axis)
        data: torch.Tensor = t._data
        return data
