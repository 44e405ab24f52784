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
