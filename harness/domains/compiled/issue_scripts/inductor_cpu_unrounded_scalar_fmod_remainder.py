import sys

import torch

# An autocast region's bf16/fp16 output taken modulo a Python scalar, compiled. CPU eager rounds the
# scalar to the tensor's dtype (1.7 -> 1.703125 in bf16): fmod(2 round(S), S) and
# remainder(-2 round(S), S) are 0. A compiler keeping S unrounded in fp32 leaves a residue, and
# remainder's sign correction makes it almost a whole modulus. Reference: eager, the same program
# uncompiled.
S = 1.7


def program(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast("cpu", dtype=dtype):
        h = x @ torch.eye(x.shape[-1])  # x's values, in the autocast dtype
    return torch.stack([torch.fmod(h[0, 0], S), torch.remainder(h[0, 1], S)]).float()


wrong = {}
for dtype in (torch.bfloat16, torch.float16):
    r = torch.tensor(S).to(dtype).item()  # the scalar rounded to the format: the inputs
    x = torch.tensor([[2 * r, -2 * r]])
    eager = program(x, dtype).tolist()
    torch._dynamo.reset()
    compiled = torch.compile(program)(x, dtype).tolist()
    print(f"{dtype}: [fmod({2 * r!r}, {S}), remainder({-2 * r!r}, {S})]: compiled {compiled}, eager {eager}")
    if compiled != eager:
        wrong[str(dtype)] = compiled
sys.exit(1 if wrong else 0)
