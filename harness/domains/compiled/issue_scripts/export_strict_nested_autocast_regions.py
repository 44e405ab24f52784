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
