import sys

import torch
from torch.utils.checkpoint import checkpoint_sequential

# torch.utils.checkpoint.checkpoint_sequential on an nn.Sequential that holds one module twice (a
# shared layer, tied weights): it takes the Sequential's children(), which lists each module once,
# so the checkpointed model silently skips the repeat, in its outputs and gradients, under autocast
# and in fp32 alike. Reference: the Sequential called as it is, which runs every entry.
torch.manual_seed(0)
shared, middle = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
seq = torch.nn.Sequential(shared, middle, shared)
x = torch.randn(4, 8, requires_grad=True)
outcome = {}
for dtype in (torch.float32, torch.bfloat16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype != torch.float32):
        called = seq(x)
        checkpointed = checkpoint_sequential(seq, 2, x, use_reentrant=False)  # type: ignore[no-untyped-call]
    outcome[str(dtype)] = "equal" if torch.equal(called, checkpointed) else "the checkpointed outputs differ"
print(f"nn.Sequential(a, b, a), called and through checkpoint_sequential (a {len(seq)}-entry Sequential): {outcome}")
sys.exit(0 if all(v == "equal" for v in outcome.values()) else 1)
