# Reproduces export-strict-nested-autocast-regions (torch 2.5 on, open (last verified 2.15); cpu, cuda).
# torch.export with strict=True of a region with autocast disabled inside an autocast region (a
# norm or rotary embedding recomputed in fp32, as Hugging Face's models do) never gives eager's
# outputs: the export raises (2.5), the program runs the regions in fp32 silently (2.6, 2.7), the
# program stops at run time on its own dtype assertion, having recorded the low-precision tensor
# entering the region as fp32 (2.8 on)
# Where: autocast regions in export (pytorch/pytorch#132677); the dtype assertions export inserts
# (pytorch/pytorch#151001, _insert_aten_to_metadata_assert_pass); no upstream report of this case
# found. Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python export_strict_nested_autocast_regions.py
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
# that disables autocast (a LayerNorm recomputed in fp32, as Hugging Face's rotary embeddings
# are), exported strict (Dynamo traces it) with torch.export and run. Reference: the same module
# in eager. Seen release by release: the export raises (2.5), the program runs the regions in fp32
# silently (2.6, 2.7), the program stops on its own dtype assertion (2.8 on).


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
outcome: dict[str, str] = {}
wrong = []
for dtype in (torch.bfloat16, torch.float16):
    m = Regions(dtype)
    with torch.no_grad():
        eager = m(x)
        try:
            program = torch.export.export(m, (x,), strict=True)
        except Exception as exc:
            if "_enter_autocast" in str(exc):  # torch 2.4: strict export has no autocast regions at all
                print(f"{dtype}: strict export has no autocast regions: {exc}")
                sys.exit(2)
            outcome[str(dtype)] = f"exporting raised {type(exc).__name__}: {exc}"
            wrong.append(True)
            continue
        try:
            exported = program.module()(x)
        except RuntimeError as exc:
            outcome[str(dtype)] = "running the program raised: " + (str(exc).strip().splitlines() or [""])[0]
            wrong.append(True)
            continue
    outcome[str(dtype)] = ", ".join(
        f"eager {a.dtype}, exported {b.dtype}" for a, b in zip(eager, exported, strict=True)
    )
    wrong.append(any(a.dtype != b.dtype or not torch.equal(a, b) for a, b in zip(eager, exported, strict=True)))
print(f"strict torch.export of a disabled region inside an autocast region: {outcome}")
sys.exit(1 if any(wrong) else 0)
