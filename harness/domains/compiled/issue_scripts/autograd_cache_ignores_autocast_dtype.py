import sys

import torch
import torch._functorch.config

# The same code compiled under bf16 autocast, then (after a Dynamo reset) under fp16 autocast: the
# fp16 compile must compute in fp16. AOTAutograd's cache, keyed on "autocast enabled" but not on its
# dtype, serves the bf16 graph. Reference: the autocast dtype the region was compiled under.
torch.manual_seed(0)
w = torch.randn(16, 16, requires_grad=True)  # a weight: AOTAutograd compiles (and caches) forward and backward
x = torch.randn(8, 16)


def linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w)


seen = {}
for dtype in (torch.bfloat16, torch.float16):
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=dtype):
        out = torch.compile(linear)(w, x)
    out.float().sum().backward()  # type: ignore[no-untyped-call]
    seen[dtype] = out.dtype
wrong = {str(k): str(v) for k, v in seen.items() if k != v}
print(f"compiled under autocast, output dtype per autocast dtype: {seen}; wrong: {wrong or 'none'}")
sys.exit(1 if wrong else 0)
