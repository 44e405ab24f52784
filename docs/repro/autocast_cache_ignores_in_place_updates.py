# Reproduces autocast-cache-ignores-in-place-updates (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# a forward after an in-place update of its parameters in the same autocast region
# (optimizer.step() or param.data.copy_ between two forwards, as RL, distillation and EMA loops
# do) computes with the casts cached before the update: the weights before the step, training
# silently frozen
# Where: aten/src/ATen/autocast_mode.cpp (cached_casts checks no version counter); met in a
# trainer: X-GenGroup/Flow-Factory#186 (frozen fp32-master training, 2026); no torch report found.
# Registered in amp-harness harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-08.
# Needs only torch. Run: python autocast_cache_ignores_in_place_updates.py
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

# One autocast region around more than a forward: a training step's update (optimizer.step()),
# or a reference model's weights swapped in (param.data.copy_), then a forward again in the same
# region (an RL or distillation loop, an EMA evaluation). Autocast caches each parameter's
# low-precision cast for the outermost region's life and never looks at the parameter again: the
# second forward computes with the weights from before the update. Reference: the updated layer
# with its operands cast by hand (no autocast, no cache).
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
outcome = {}
for how in ("optimizer.step()", "param.data.copy_()"):
    for dtype in (torch.bfloat16, torch.float16):
        torch.manual_seed(0)
        layer = torch.nn.Linear(16, 8)
        opt = torch.optim.SGD(layer.parameters(), lr=0.5)
        with torch.autocast("cpu", dtype=dtype):
            before = layer(x)
            if how == "optimizer.step()":
                before.float().pow(2).sum().backward()
                opt.step()
            else:
                with torch.no_grad():
                    layer.weight.data.copy_(torch.randn(8, 16))
            after = layer(x)
        w, b = layer.weight.detach().to(dtype), layer.bias.detach().to(dtype)
        expected = torch.nn.functional.linear(x.to(dtype), w, b)
        if torch.equal(after, expected):
            outcome[f"{how}, {dtype}"] = "the updated weights"
        elif torch.equal(after, before):
            outcome[f"{how}, {dtype}"] = "the weights before the update"
        else:
            outcome[f"{how}, {dtype}"] = "neither"
print(f"an in-place parameter update, then a forward, in one CPU autocast region: {outcome}")
sys.exit(0 if all(v == "the updated weights" for v in outcome.values()) else 1)
