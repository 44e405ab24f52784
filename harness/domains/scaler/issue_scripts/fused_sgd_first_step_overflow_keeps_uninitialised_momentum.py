import math
import sys

import torch

# SGD(momentum, fused=True) stepped by GradScaler: the first step overflows and is skipped. The next
# step must start the momentum buffer from that step's gradient, as the for-loop SGD does: the
# parameters after it are finite. The buffer left by the skipped step is filled with NaN (what
# uninitialised memory may hold) to make the outcome deterministic.
p = torch.nn.Parameter(torch.ones(4))
sgd = torch.optim.SGD([p], lr=0.1, momentum=0.9, fused=True)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
for t in range(2):
    sgd.zero_grad(set_to_none=True)
    torch.autograd.backward(scaler.scale((p * 2).sum()))
    if t == 0 and p.grad is not None:
        p.grad.view(-1)[0] = math.inf
    scaler.step(sgd)
    scaler.update()
    if t == 0:
        buf = sgd.state.get(p, {}).get("momentum_buffer")
        if isinstance(buf, torch.Tensor):
            buf.fill_(math.nan)
expected = 1.0 - 0.1 * 2.0  # reference: one SGD step from a fresh buffer, p - lr * g, in float64
allowance = 4 * 2.0**-24  # float32's roundings of lr * g and the subtraction, on values <= 1 (2 u each)
error = max(abs(v - expected) if math.isfinite(v) else math.inf for v in p.detach().tolist())
print(f"step after a skipped first step: |p - {expected}| = {error!r}; allowed {allowance!r} (float32 roundings)")
sys.exit(0 if error <= allowance else 1)
