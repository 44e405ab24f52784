# Reproduces checkpoint-sequential-drops-repeated-modules (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# torch.utils.checkpoint.checkpoint_sequential on an nn.Sequential holding one module twice (a
# shared layer) runs it once: it takes the Sequential's children(), which list each module once,
# so the checkpointed model silently differs from the model, in fp32 and under autocast alike
# Where: torch/utils/checkpoint.py checkpoint_sequential (functions.children()); no upstream
# report found: found by the harness's shared-layer checkpointing check. Registered in amp-harness
# harness/domains/patterns/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python checkpoint_sequential_drops_repeated_modules.py
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
