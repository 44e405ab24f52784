import sys

import torch

# Under autocast, eager rounds every op's output to the autocast dtype. A chain of pointwise ops on
# a bf16 matmul's output, compiled, must give eager's bits (Inductor keeps fused intermediates in
# fp32 unless torch._inductor.config.emulate_precision_casts = True). Reference: eager, op by op.
torch.manual_seed(0)
x, w = torch.randn(64, 64), torch.randn(64, 64)


def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x @ w  # bf16 under autocast
    return (torch.tanh(y) * 1.7 + y).sigmoid() * y


with torch.autocast("cpu", dtype=torch.bfloat16):
    eager = block(x, w)
    compiled = torch.compile(block)(x, w)
differ = int((eager.float() != compiled.float()).sum())
print(
    f"compiled vs eager under bf16 autocast: {differ} of {eager.numel()} elements differ (allowed 0: eager's roundings)"
)
sys.exit(1 if differ else 0)
