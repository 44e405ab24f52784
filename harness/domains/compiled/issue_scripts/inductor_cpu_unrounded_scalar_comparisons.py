import sys

import torch

# An autocast region's bf16/fp16 output compared with a Python scalar, compiled. Eager rounds the
# scalar to the tensor's dtype first (1.7 -> 1.703125 in bf16), so an element equal to the rounded
# scalar is == S and not > S. A compiler keeping the scalar unrounded in fp32 says the opposite.
# Reference: eager, the same program uncompiled.
S = 1.7


def program(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast("cpu", dtype=dtype):
        h = x @ torch.eye(x.shape[-1])  # x's values, in the autocast dtype
    return torch.stack([h[0, 0] > S, h[0, 0] == S])


wrong = {}
for dtype in (torch.bfloat16, torch.float16):
    r = torch.tensor(S).to(dtype).item()  # the scalar rounded to the format: the input
    x = torch.tensor([[r]])
    eager = program(x, dtype).tolist()
    torch._dynamo.reset()
    compiled = torch.compile(program)(x, dtype).tolist()
    print(f"{dtype}: h = {r!r}: (h > {S}, h == {S}) compiled {compiled}, eager {eager}")
    if compiled != eager:
        wrong[str(dtype)] = compiled
sys.exit(1 if wrong else 0)
