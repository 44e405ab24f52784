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
