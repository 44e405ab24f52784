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
