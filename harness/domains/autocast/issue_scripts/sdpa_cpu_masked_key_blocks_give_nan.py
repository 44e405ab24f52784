import math
import sys

import torch
import torch.nn.functional as F

# Attention with an additive mask that leaves every query some keys: a sliding window (each query
# sees itself and the 9 before it) over a long sequence, as local attention runs it. A block of
# queries meets whole blocks of masked keys: a kernel that computes exp(-inf - (-inf)) there makes
# NaN rows that IEEE arithmetic keeps finite. Reference: attention written out in float64, finite
# everywhere; every output of the op must be finite, in fp32 and under autocast.
n, heads, width = 640, 2, 8
full = torch.full((n, n), -math.inf)
mask = torch.triu(full, diagonal=1) + torch.tril(full, diagonal=-10)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, heads, n, width, generator=g) for _ in range(3))
scores = torch.matmul(q.double(), k.double().transpose(-1, -2)) / math.sqrt(width) + mask.double()
assert torch.matmul(torch.softmax(scores, -1), v.double()).isfinite().all()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


outcome = {}
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        out = attention(q, k, v)
    bad = int((~out.isfinite()).any(-1).sum())
    outcome[str(dtype)] = f"{bad} of {heads * n} rows non-finite" if bad else "finite"
print(f"a sliding-window mask over {n} positions, CPU attention: {outcome}")
sys.exit(0 if all(v == "finite" for v in outcome.values()) else 1)
