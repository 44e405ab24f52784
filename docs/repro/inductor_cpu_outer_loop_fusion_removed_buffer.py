# Reproduces inductor-cpu-outer-loop-fusion-removed-buffer (torch 2.6 to before 2.7, fixed in 2.7; cpu).
# Inductor's CPU outer-loop fusion localises a buffer, fails to merge the loops, and falls back to
# plain code that still reads the removed global buffer: a softmax and a log-softmax of the same
# logits, differentiated (a distillation or an entropy term beside the cross-entropy), stop the
# compile with 'AssertionError: buf0', in fp32 and under bf16/fp16 autocast alike, so the compiled
# step cannot run
# Where: pytorch/pytorch#144186 (sum-softmax, the same assertion); fixed by #144243 (restore
# removed buffers before the fallback), after 2.6's branch cut. Registered in amp-harness
# harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python inductor_cpu_outer_loop_fusion_removed_buffer.py
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

# A training step whose logits feed a cross-entropy and a distillation term (a softmax of a teacher's
# logits against a log-softmax of the student's), under bf16 CPU autocast, compiled with Inductor,
# forward and backward. Inductor's outer-loop fusion localises a buffer of the softmax rows, cannot
# merge the loops, and falls back to code that still reads the removed buffer: the compile stops
# with "AssertionError: buf0" (fp32 too). Reference: it compiles and runs, as eager runs.
torch.manual_seed(0)
student, teacher = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64).requires_grad_(False)
x, y = torch.randn(4, 16, 64), torch.randint(0, 64, (4, 16))


def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = student(x).flatten(0, 1)
        soft = F.softmax(teacher(x).flatten(0, 1) / 2.0, -1)
        kd = F.kl_div(F.log_softmax(logits / 2.0, -1), soft, reduction="batchmean") * 4.0
        entropy = (F.softmax(logits, -1) * F.log_softmax(logits, -1)).sum(-1).mean()
        return F.cross_entropy(logits, y.flatten()) + kd + 0.1 * entropy


try:
    torch.autograd.backward(torch.compile(step)(x, y))
except Exception as exc:
    text = f"{type(exc).__name__}: {exc}"
    at = text.find("AssertionError: buf")
    if at < 0 or not text[at + len("AssertionError: buf") :][:1].isdigit():
        raise  # another failure: not this issue (the script could not say)
    print(f"the compiled step does not compile: {text[at:].splitlines()[0]}")
    sys.exit(1)
print("the compiled step compiles and runs, forward and backward")
sys.exit(0)
