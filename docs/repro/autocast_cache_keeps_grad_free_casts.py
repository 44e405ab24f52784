# Reproduces autocast-cache-keeps-grad-free-casts (torch 2.4 to before 2.11, fixed in 2.11; cpu, cuda).
# a module evaluated under torch.no_grad (or inference_mode) and then trained in one autocast
# region: the training pass reuses the weight casts autocast cached without autograd history, so
# the weights before a LayerNorm silently get no gradient (without one, backward raises)
# Where: pytorch/pytorch#142234 and #158232 (the no_grad case of #112583 came back), fixed by
# #165068. Registered in amp-harness harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python autocast_cache_keeps_grad_free_casts.py
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

# One autocast region: a module is first evaluated without autograd (torch.no_grad: a teacher's
# or reference pass, an evaluation inside the training step), then trained. Autocast's weight
# cache keeps the low-precision casts made in the first pass, which carry no autograd history; if
# the training pass reuses them, the weights before the LayerNorm silently get no gradient (or,
# without it, backward raises). Reference: every parameter gets a gradient, as it does when the
# training pass runs alone in its region.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
x = torch.randn(4, 16)
outcome = {}
for dtype in (torch.bfloat16, torch.float16):
    model.zero_grad(set_to_none=True)
    try:
        with torch.autocast("cpu", dtype=dtype):
            with torch.no_grad():
                model(x)
            loss = model(x).float().pow(2).mean()
        loss.backward()
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        outcome[str(dtype)] = f"no gradient for {missing}" if missing else "every parameter has a gradient"
    except RuntimeError as exc:
        outcome[str(dtype)] = "backward raised: " + (str(exc).strip().splitlines() or [""])[0]
print(f"no_grad pass, then a training pass, in one CPU autocast region: {outcome}")
sys.exit(0 if all(v == "every parameter has a gradient" for v in outcome.values()) else 1)
