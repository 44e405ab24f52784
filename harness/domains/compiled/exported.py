"""``torch.export`` of a module whose forward holds autocast regions.

Exporting is how an AMP-trained model reaches deployment (AOTInductor, ExecuTorch, ONNX), and a
model's forward often carries its own autocast regions: a low-precision block, and inside it a
region with autocast disabled that recomputes something in fp32 (Hugging Face's rotary embeddings
do exactly that). The exported program must run those regions as eager does. Release by release it
did not: non-strict export dropped the regions (fp32 throughout) until 2.6; strict export of the
nested region raised in 2.5, dropped the regions in 2.6 and 2.7, and from 2.8 records the disabled
region's input as fp32, so its program stops at run time on a dtype assertion.

The claim, per export mode: the exported program, run, gives eager's outputs (dtypes, and values
bit for bit: the same kernels run). The verdict is decided here; the suite states it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from harness.domains.engines.state import same_bits
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.platform.versions import release

#: export modes: torch.export.export's ``strict`` (Dynamo traces the forward) or not (Python runs it)
MODES = {"strict": True, "non_strict": False}


class Regions(nn.Module):
    """A Linear in a low-precision region; inside it, a region with autocast disabled that
    normalises the Linear's output in fp32; a softmax of the low-precision output."""

    def __init__(self, dtype: torch.dtype, device_type: str) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.dtype, self.device_type = dtype, device_type

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.autocast(self.device_type, dtype=self.dtype):
            h = self.linear(x)
            with torch.autocast(self.device_type, enabled=False):
                fp32 = self.norm(h.float())
            return h, fp32, torch.softmax(h, -1)


OUTPUTS = ("linear", "fp32_region", "softmax")


def missing(mode: str) -> str | None:
    """Why this torch cannot export in ``mode`` (None where it can)."""
    if not hasattr(torch, "export"):
        return f"torch {torch.__version__} has no torch.export"
    if "strict" not in inspect.signature(torch.export.export).parameters:
        return f"torch {torch.__version__}'s torch.export.export has no strict argument"
    if mode == "strict" and release(torch.__version__)[:2] < (2, 5):
        return (
            f"torch {torch.__version__}'s strict export has no autocast regions (they became a higher-order op in "
            "export in 2.5, pytorch/pytorch#132677)"
        )
    return None


@dataclass(frozen=True)
class ExportRun:
    """Eager's outputs and the exported program's (None where a step raised), and what raised."""

    eager: tuple[torch.Tensor, ...]
    exported: tuple[torch.Tensor, ...] | None
    stage: str | None = None
    raised: str | None = None


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


def run(mode: str, device: torch.device, dtype: torch.dtype) -> ExportRun:
    """The module on a batch in eager, then exported in ``mode`` and its program run on it."""
    torch.manual_seed(0)
    m = Regions(dtype, device.type).to(device)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        eager = m(x)
        try:
            program = torch.export.export(m, (x,), strict=MODES[mode])
        except Exception as exc:  # an export that refuses the module is the verdict, not a crash
            return ExportRun(eager, None, "export", _first_line(exc))
        try:
            exported = program.module()(x)
        except Exception as exc:
            return ExportRun(eager, None, "run", _first_line(exc))
    return ExportRun(eager, tuple(exported))


def differences(seen: ExportRun) -> list[str]:
    """Each output whose dtype or bits (NaN equal to NaN) differ from eager's, or the step that raised."""
    if seen.exported is None:
        return [f"the {seen.stage} raised {seen.raised}"]
    out = []
    for name, a, b in zip(OUTPUTS, seen.eager, seen.exported, strict=True):
        if a.dtype != b.dtype:
            out.append(f"{name}: eager {a.dtype}, exported {b.dtype}")
        elif not same_bits(a, b):
            out.append(f"{name}: values differ (max |diff| {(a.float() - b.float()).abs().max().item():.3g})")
    return out


def claim(mode: str, dtype: torch.dtype, seen: ExportRun) -> ClaimComparison:
    """The exported program gives eager's outputs, dtypes and bits."""
    wrong = differences(seen)
    return compare_claim(
        f"export.{mode}.outputs_differing",
        len(wrong),
        not wrong,
        "a module with autocast regions in its forward, exported and run, gives eager's outputs (dtypes and bits)",
        detail=f"{mode} export under {dtype} regions: {'; '.join(wrong)}",
        expected=0,
        allowance=0,
        unit="outputs",
    )
