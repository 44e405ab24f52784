# Reproduces sharded-cpu-growth-uncapped (torch 2.4 on, open (last verified 2.15); cpu).
# ShardedGradScaler's CPU update (_amp_update_scale_cpu_) multiplies the scale by the growth
# factor without the float32 cap GradScaler applies: the scale becomes inf and stays there (inf x
# backoff = inf), so every later step is skipped
# Where: torch/distributed/fsdp/sharded_grad_scaler.py: _amp_update_scale_cpu_ (vs
# torch._amp_update_scale_). Registered in amp-harness harness/domains/scaler/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python sharded_cpu_growth_uncapped.py
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
