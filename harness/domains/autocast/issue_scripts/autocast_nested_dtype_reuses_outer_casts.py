import sys

import torch

# A region of another low-precision dtype nested in an autocast region (a block that must run in
# float16 inside a bfloat16 forward, or the reverse). Autocast's weight cache is keyed by the
# tensor, not by the dtype: the inner region's matmul gets the weight cast the outer region cached,
# in the outer dtype, and raises on mixed dtypes. Reference: the layer with its operands cast to
# the inner dtype by hand (no autocast, no cache), bit for bit.
torch.manual_seed(0)
layer = torch.nn.Linear(16, 8)
x = torch.randn(4, 16)
outcome = {}
for outer, inner in ((torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)):
    case = f"{outer} outside, {inner} inside"
    w, b = layer.weight.detach().to(inner), layer.bias.detach().to(inner)
    by_hand = torch.nn.functional.linear(x.to(inner), w, b)
    try:
        with torch.autocast("cpu", dtype=outer):
            layer(x)
            with torch.autocast("cpu", dtype=inner):
                nested = layer(x)
    except RuntimeError as exc:
        outcome[case] = "raised: " + (str(exc).strip().splitlines() or [""])[0]
        continue
    same = nested.dtype == by_hand.dtype and torch.equal(nested, by_hand)
    outcome[case] = "as cast by hand" if same else f"{nested.dtype}, where cast by hand gives {by_hand.dtype}"
print(f"a layer used in a CPU autocast region, then in a region of another dtype nested in it: {outcome}")
sys.exit(0 if all(v == "as cast by hand" for v in outcome.values()) else 1)
