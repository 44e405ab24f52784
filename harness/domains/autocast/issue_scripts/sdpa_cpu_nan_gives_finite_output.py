import math
import sys

import torch
import torch.nn.functional as F

# A NaN in one element of a query reaching scaled_dot_product_attention on the CPU (under autocast
# as in fp32): the query's row comes out finite (zeros) where the arithmetic gives NaN, at a short
# sequence (length 5) or at 16, depending on the release. The NaN is hidden from the loss.
# Reference: attention written out in float64 by matmul, exp and sum.


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.matmul(weights / weights.sum(-1, keepdim=True), v.double())


outcome = {}
for length in (5, 16, 64):
    for dtype in (torch.bfloat16, torch.float16):
        g = torch.Generator().manual_seed(length)
        q, k, v = (torch.randn(1, 2, length, 16, generator=g) for _ in range(3))
        q[0, 0, 3, 0] = math.nan
        expected = ~reference(q, k, v).isfinite()
        with torch.autocast("cpu", dtype=dtype):
            got = ~attend(q, k, v).isfinite()
        outcome[f"length {length}, {dtype}"] = f"{int((expected & ~got).sum())} of {int(expected.sum())} hidden"
print(f"a NaN in a query under CPU autocast, non-finite outputs come out finite: {outcome}")
sys.exit(1 if any(not v.startswith("0 of") for v in outcome.values()) else 0)
