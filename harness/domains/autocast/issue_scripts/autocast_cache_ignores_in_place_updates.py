import sys

import torch

# One autocast region around more than a forward: a training step's update (optimizer.step()),
# or a reference model's weights swapped in (param.data.copy_), then a forward again in the same
# region (an RL or distillation loop, an EMA evaluation). Autocast caches each parameter's
# low-precision cast for the outermost region's life and never looks at the parameter again: the
# second forward computes with the weights from before the update. Reference: the updated layer
# with its operands cast by hand (no autocast, no cache).
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
outcome = {}
for how in ("optimizer.step()", "param.data.copy_()"):
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        layer = torch.nn.Linear(16, 8)
        opt = torch.optim.SGD(layer.parameters(), lr=0.5)
        with torch.autocast("cpu", dtype=dtype):
            before = layer(x)
            if how == "optimizer.step()":
                before.float().pow(2).sum().backward()
                opt.step()
            else:
                with torch.no_grad():
                    layer.weight.data.copy_(torch.randn(8, 16))
            after = layer(x)
        w, b = layer.weight.detach().to(dtype), layer.bias.detach().to(dtype)
        expected = torch.nn.functional.linear(x.to(dtype), w, b)
        if torch.equal(after, expected):
            outcome[f"{how}, {dtype}"] = "the updated weights"
        elif torch.equal(after, before):
            outcome[f"{how}, {dtype}"] = "the weights before the update"
        else:
            outcome[f"{how}, {dtype}"] = "neither"
print(f"an in-place parameter update, then a forward, in one CPU autocast region: {outcome}")
sys.exit(0 if all(v == "the updated weights" for v in outcome.values()) else 1)
