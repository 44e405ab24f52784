import sys

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

try:  # torch 2.6 moved FSDP2 to torch.distributed.fsdp
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # type: ignore[attr-defined,no-redef,unused-ignore]
from torch.distributed.device_mesh import init_device_mesh

# FSDP2 units under a MixedPrecisionPolicy, each checkpointed (non-reentrant) as Hugging Face's
# gradient checkpointing wraps its layers, each given a table its parent computed in fp32 (the
# rotary embeddings' cos and sin). The unit's pre-forward hook casts its inputs to the policy's
# dtype; if the recomputation in backward skips that cast, it runs on the fp32 table, and the
# checkpoint's metadata check raises (or the recomputed values differ). Reference: the same
# sharded model without checkpointing, whose gradients the checkpointed one must give bit for bit.
# One rank, in this process (gloo on the CPU).
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
mesh = init_device_mesh("cpu", (1,))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(h) * table)


class Net(torch.nn.Module):
    def __init__(self, checkpointed: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.table_dtype = torch.float32
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(16, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        table = torch.cos(torch.arange(16, dtype=torch.float32) / 16).to(self.table_dtype)
        for block in self.blocks:
            h = checkpoint(block, h, table, use_reentrant=False) if self.checkpointed else block(h, table)
        out: torch.Tensor = self.head(h)
        return out


outcome = {}
for dtype in (torch.bfloat16, torch.float16):
    grads: dict[bool, list[torch.Tensor] | str] = {}
    for checkpointed in (False, True):
        torch.manual_seed(0)
        net = Net(checkpointed, dtype)
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for block in net.blocks:
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(net, mesh=mesh, mp_policy=policy)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
        try:
            torch.autograd.backward(net(x).float().pow(2).mean())
            grads[checkpointed] = [p.grad.to_local() for p in net.parameters()]  # type: ignore[union-attr]
        except RuntimeError as exc:
            grads[checkpointed] = f"raised {type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0]
    plain, checked = grads[False], grads[True]
    if isinstance(plain, str):
        outcome[str(dtype)] = f"the model without checkpointing {plain}"
    elif isinstance(checked, str):
        outcome[str(dtype)] = f"the checkpointed backward {checked}"
    else:
        same = all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
        outcome[str(dtype)] = "bit for bit" if same else "gradients differ"
dist.destroy_process_group()
print(f"checkpointed FSDP2 units under a MixedPrecisionPolicy, against the unchecked model: {outcome}")
sys.exit(0 if all(v == "bit for bit" for v in outcome.values()) else 1)
