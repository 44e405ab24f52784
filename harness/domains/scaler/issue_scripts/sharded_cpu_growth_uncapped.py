import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

# torch.amp.GradScaler does not apply a growth that would overflow float32 (the scale stays finite);
# ShardedGradScaler on the CPU must follow the same rule. One clean step at 2^126 with growth x4:
# 2^128 is not a float32, so the scale must stay 2^126.
store = dist.HashStore()  # type: ignore[attr-defined]
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
scaler = ShardedGradScaler("cpu", init_scale=2.0**126, growth_factor=4.0, growth_interval=1)
p = torch.nn.Parameter(torch.ones(2))
opt = torch.optim.SGD([p], lr=0.0)
torch.autograd.backward(scaler.scale(p.sum()))
scaler.step(opt)
scaler.update()
measured = scaler.get_scale()
expected = 2.0**126  # reference: growth applied only while the product stays finite in float32
dist.destroy_process_group()
print(f"ShardedGradScaler scale after one clean step: {measured!r}; expected {expected!r} (allowance: exact)")
sys.exit(1 if measured != expected else 0)
