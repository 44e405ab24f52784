import sys

import torch

# A Linear with a bias mapped over a batch with torch.vmap (per-sample gradients, ensembles) under
# CPU autocast. vmap's batching rule splits addmm into a matmul and an add below autocast's
# dispatch: the matmul runs in the autocast dtype, the bias add in fp32, and the output is fp32.
# Reference: the same Linear on the whole batch under the same autocast, which returns the
# autocast dtype (as the vmapped Linear without a bias does).
torch.manual_seed(0)
x = torch.randn(16, 8)
outcome = {}
differs = []
for dtype in (torch.bfloat16, torch.float16):
    linear = torch.nn.Linear(8, 6)
    with torch.autocast("cpu", dtype=dtype):
        whole = linear(x)
        mapped = torch.vmap(linear)(x)
    outcome[str(dtype)] = f"whole batch {whole.dtype}, vmapped {mapped.dtype}"
    differs.append(mapped.dtype != whole.dtype)
print(f"nn.Linear under CPU autocast: {outcome}")
sys.exit(1 if any(differs) else 0)
