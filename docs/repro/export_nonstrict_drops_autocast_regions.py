# Reproduces export-nonstrict-drops-autocast-regions (torch 2.4 to before 2.6, fixed in 2.6; cpu, cuda).
# torch.export with strict=False leaves a module's autocast regions out of the exported program:
# it runs them in fp32 where eager runs them in the autocast dtype, silently (the deployed model
# has no AMP)
# Where: pytorch/pytorch#137495 (autocast nodes missing from non-strict export graphs), fixed
# there. Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python export_nonstrict_drops_autocast_regions.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

import sys

import torch

# A module whose forward holds an autocast region (a Linear, a softmax) with a region inside it
# that disables autocast (a LayerNorm in fp32), exported non-strict with torch.export and run.
# Reference: the same module in eager, whose region outputs are in the autocast dtype. A program
# that gives fp32 there dropped the regions: the deployed model runs without AMP, silently.


class Regions(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.autocast("cpu", dtype=self.dtype):
            h = self.linear(x)
            with torch.autocast("cpu", enabled=False):
                fp32 = self.norm(h.float())
            return h, fp32, torch.softmax(h, -1)


torch.manual_seed(0)
x = torch.randn(4, 16)
outcome, dropped = {}, []
for dtype in (torch.bfloat16, torch.float16):
    m = Regions(dtype)
    with torch.no_grad():
        eager = m(x)
        try:
            exported = torch.export.export(m, (x,), strict=False).module()(x)
        except Exception as exc:
            print(f"{dtype}: exporting or running raised {type(exc).__name__}: {exc}")
            sys.exit(2)
    outcome[str(dtype)] = [f"eager {a.dtype}, exported {b.dtype}" for a, b in zip(eager, exported, strict=True)]
    dropped.append(any(a.dtype != b.dtype for a, b in zip(eager, exported, strict=True)))
print(f"non-strict torch.export of autocast regions: {outcome}")
sys.exit(1 if any(dropped) else 0)
