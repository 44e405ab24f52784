# Reproduces inductor-elides-eager-roundings (torch 2.13 to before 2.14, fixed in 2.14; cpu, cuda).
# Inductor keeps fused low-precision intermediates in fp32 where eager rounds every op's output to
# the autocast dtype (torch._inductor.config.emulate_precision_casts = False by default): compiled
# and eager AMP outputs differ at fused stages; with emulate_precision_casts = True they agree
# there
# Where: pytorch/pytorch#168148, #183761; torch/_inductor/config.py emulate_precision_casts.
# Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-04.
# Needs only torch. Run: python inductor_elides_eager_roundings.py
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

# Under autocast, eager rounds every op's output to the autocast dtype. A chain of pointwise ops on
# a bf16 matmul's output, compiled, must give eager's bits (Inductor keeps fused intermediates in
# fp32 unless torch._inductor.config.emulate_precision_casts = True). Reference: eager, op by op.
torch.manual_seed(0)
x, w = torch.randn(64, 64), torch.randn(64, 64)


def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x @ w  # bf16 under autocast
    return (torch.tanh(y) * 1.7 + y).sigmoid() * y


with torch.autocast("cpu", dtype=torch.bfloat16):
    eager = block(x, w)
    compiled = torch.compile(block)(x, w)
differ = int((eager.float() != compiled.float()).sum())
print(
    f"compiled vs eager under bf16 autocast: {differ} of {eager.numel()} elements differ (allowed 0: eager's roundings)"
)
sys.exit(1 if differ else 0)
