import sys

import torch

# One autocast region: a module is first evaluated without autograd (torch.no_grad: a teacher's
# or reference pass, an evaluation inside the training step), then trained. Autocast's weight
# cache keeps the low-precision casts made in the first pass, which carry no autograd history; if
# the training pass reuses them, the weights before the LayerNorm silently get no gradient (or,
# without it, backward raises). Reference: every parameter gets a gradient, as it does when the
# training pass runs alone in its region.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
x = torch.randn(4, 16)
outcome = {}
for dtype in (torch.bfloat16, torch.float16):
    model.zero_grad(set_to_none=True)
    try:
        with torch.autocast("cpu", dtype=dtype):
            with torch.no_grad():
                model(x)
            loss = model(x).float().pow(2).mean()
        loss.backward()
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        outcome[str(dtype)] = f"no gradient for {missing}" if missing else "every parameter has a gradient"
    except RuntimeError as exc:
        outcome[str(dtype)] = "backward raised: " + (str(exc).strip().splitlines() or [""])[0]
print(f"no_grad pass, then a training pass, in one CPU autocast region: {outcome}")
sys.exit(0 if all(v == "every parameter has a gradient" for v in outcome.values()) else 1)
