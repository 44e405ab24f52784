# Reproduces update-int-new-scale (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# GradScaler.update(new_scale) accepts a float or a tensor; a Python int falls into the tensor
# branch and raises AttributeError ('int' object has no attribute 'device')
# Where: torch/amp/grad_scaler.py: update(): isinstance(new_scale, float) else tensor checks.
# Registered in amp-harness harness/domains/scaler/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python update_int_new_scale.py
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

# GradScaler.update(new_scale) documents "new_scale (float or torch.Tensor)"; a Python int is a number
# the user means exactly: update(1024) must do what update(1024.0) does.
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
p = torch.nn.Parameter(torch.ones(4))
opt = torch.optim.SGD([p], lr=0.1)
torch.autograd.backward(scaler.scale((p * 2).sum()))
scaler.step(opt)
expected = 1024.0  # the reference: the float the int names
try:
    scaler.update(1024)
    measured = f"scale {scaler.get_scale()!r}"
    defect = scaler.get_scale() != expected
except Exception as e:
    measured, defect = f"{type(e).__name__}: {e}", True
print(f"update(1024): {measured}; expected scale {expected!r} (allowance: exact)")
sys.exit(1 if defect else 0)
