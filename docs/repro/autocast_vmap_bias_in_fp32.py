# Reproduces autocast-vmap-bias-in-fp32 (torch 2.4 on, open (last verified 2.15); cpu).
# a Linear or convolution with a bias under torch.vmap and autocast returns fp32 where the
# unbatched call returns the autocast dtype: the batching rule splits the op into a matmul (low
# precision) and a bias add that runs in fp32 below autocast's dispatch
# Where: pytorch/pytorch#192617 (open). Registered in amp-harness
# harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python autocast_vmap_bias_in_fp32.py
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

# A Linear with a bias mapped over a batch with torch.vmap (per-sample gradients, ensembles) under
# CPU autocast. vmap's batching rule splits addmm into a matmul and an add below autocast's
# dispatch: the matmul runs in the autocast dtype, the bias add in fp32, and the output is fp32.
# Reference: the same Linear on the whole batch under the same autocast, which returns the
# autocast dtype (as the vmapped Linear without a bias does).
torch.manual_seed(0)
x = torch.randn(16, 8)
outcome = {}
differs = []
for dtype in (torch.bfloat16, torch.float16):
    linear = torch.nn.Linear(8, 6)
    with torch.autocast("cpu", dtype=dtype):
        whole = linear(x)
        mapped = torch.vmap(linear)(x)
    outcome[str(dtype)] = f"whole batch {whole.dtype}, vmapped {mapped.dtype}"
    differs.append(mapped.dtype != whole.dtype)
print(f"nn.Linear under CPU autocast: {outcome}")
sys.exit(1 if any(differs) else 0)
