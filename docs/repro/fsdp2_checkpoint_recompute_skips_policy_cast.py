# Reproduces fsdp2-checkpoint-recompute-skips-policy-cast (torch 2.7 to before 2.13, fixed in 2.13; cpu).
# an FSDP2 unit under a MixedPrecisionPolicy, checkpointed (non-reentrant): its recomputation in
# backward skips the unit's pre-forward cast of its inputs, so an fp32 input the forward got cast
# (a rotary table) recomputes in fp32 and the checkpoint's metadata check raises
# Where: pytorch/pytorch#148831 and #159359; the pre-forward hook's early return in PRE_BACKWARD
# (torch/distributed/fsdp/_fully_shard/_fsdp_state.py) casts the inputs from 2.13. Registered in
# amp-harness harness/domains/patterns/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python fsdp2_checkpoint_recompute_skips_policy_cast.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

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
