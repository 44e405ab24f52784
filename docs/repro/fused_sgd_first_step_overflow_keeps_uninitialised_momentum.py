# Reproduces fused-sgd-first-step-overflow-keeps-uninitialised-momentum (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# SGD(momentum, fused=True) allocates its momentum buffers with empty_like before its first step;
# when GradScaler skips that step for an overflow (found_inf), the kernel returns without writing
# them, and the next step reads the uninitialised memory as momentum: parameters jumped by 2.6e14
# in one step
# Where: torch/optim/sgd.py: _fused_sgd() (is_first_step, empty_like) and _fused_sgd_'s found_inf
# early return. Registered in amp-harness harness/domains/scaler/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python fused_sgd_first_step_overflow_keeps_uninitialised_momentum.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

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
