"""fp8 scaled matmul against bf16 matmul: the speed case of the fp8 suite.

Measured through :func:`harness.domains.engines.bench.bench.measure` like every speed case, and judged
against the hardware class's calibrated threshold once ``amp-harness calibrate --cases
scaled_mm_e4m3/float8_e4m3fn`` has written one; until then recorded, not judged. On GPUs with fp8
tensor cores this is where fp8 pays; on CPUs it is a finding per hardware class (docs/fp8.md).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.domains.engines.bench.workload import Fn, Workload
from harness.platform import kernels

#: matrix size per device type: small on CPUs, whose e4m3 x e4m3 kernel can be an emulation slow
#: enough to dominate the suite's time at larger sizes; large enough to fill a GPU
SIZE = {"cpu": 64, "cuda": 4096}


def _size(device: torch.device) -> int:
    return SIZE.get(device.type, SIZE["cpu"])


def _operands(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    n = _size(device)
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, n, generator=g).to(device), torch.randn(n, n, generator=g).to(device)


def _bf16_matmul(device: torch.device, dtype: torch.dtype) -> Fn:
    a, b = (t.to(torch.bfloat16) for t in _operands(device))

    def run() -> Any:
        return a @ b

    return run


def _scaled_mm(device: torch.device, dtype: torch.dtype | None) -> Fn:
    fp8 = dtype or torch.float8_e4m3fn
    a, b = _operands(device)
    fmax = torch.finfo(fp8).max
    sa, sb = ((fmax / t.abs().max()).float() for t in (a, b))
    qa = (a * sa).to(fp8)
    # column-major second operand, as _scaled_mm requires (an elementwise op keeps its input's
    # strides, so the layout is made by a copy, not by scaling a transposed view)
    qb = (b * sb).to(fp8).t().contiguous().t()
    inv_a, inv_b = sa.reciprocal(), sb.reciprocal()

    def run() -> Any:
        return torch._scaled_mm(qa, qb, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.bfloat16)

    return run


SCALED_MM = Workload(
    "scaled_mm_e4m3",
    _scaled_mm,
    None,
    baseline=_bf16_matmul,
    baseline_name="bf16 matmul",
    baseline_dtype="bfloat16",
    unavailable=kernels.scaled_mm_missing,
)

#: (workload, dtype) cases of the fp8 speed check, calibrated with ``--cases``
CASES: tuple[tuple[str, str], ...] = (("scaled_mm_e4m3", "float8_e4m3fn"),)
WORKLOADS: dict[str, Workload] = {SCALED_MM.name: SCALED_MM}
