# Reproduces inductor-cpu-vectorizedn-fmadd-build-failure (torch 2.5 to before 2.6, fixed in 2.6; cpu).
# Inductor's CPU code for the backward of logits that feed both a softmax and a cross-entropy loss
# under bf16 autocast calls fmadd on VectorizedN<float, 2> operands, an overload ATen does not
# have: the C++ does not build (CppCompileError), so the compiled AMP step cannot run at all
# Where: Inductor CPU vectorization of VectorizedN (torch 2.5.1); of the class of
# pytorch/pytorch#143568. Registered in amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python inductor_cpu_vectorizedn_fmadd_build_failure.py
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
import torch.nn.functional as F

# Under bf16 CPU autocast, logits that feed both a softmax and a cross-entropy loss, compiled with
# Inductor, forward and backward. The fused backward kernel of the logits' gradient calls fmadd on
# VectorizedN<float, 2> operands, which has no such overload: the C++ does not build. Reference:
# it builds and runs, as eager runs.
torch.manual_seed(0)
lin = torch.nn.Linear(32, 32)
x, y = torch.randn(4, 8, 32), torch.randint(0, 32, (4, 8))


def block(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits: torch.Tensor = lin(x)
        probs = logits.softmax(-1)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    return loss + probs.float().pow(2).sum()


try:
    torch.autograd.backward(torch.compile(block)(x, y))
except Exception as exc:
    if type(exc).__name__ != "CppCompileError" and "C++ compile error" not in str(exc):
        raise  # another failure: not this issue (the script could not say)
    said = [line.strip() for line in str(exc).splitlines() if "error:" in line][:1]
    print(f"the compiled block does not build: {said[0] if said else 'C++ compile error'}")
    sys.exit(1)
print("the compiled block builds and runs, forward and backward")
sys.exit(0)
