import sys

import torch

# SGD(fused=True) on the CPU, one step of bf16 and of fp16 parameters (131 elements: whole vector
# blocks of every SIMD width and a remainder) with a gradient of ones. The reference, in float64
# from the same values: p - lr * g. Each new element must be within two roundings of the
# parameter's format of it (the product lr * g and the sum, as the for-loop SGD computes them):
# |p - ref| <= 2 u (|p| + lr |g|), u the format's unit roundoff (2^-8 bf16, 2^-11 fp16).
worst = 0.0
for dtype, u in ((torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
    start = torch.linspace(0.25, 1.0, 131, dtype=torch.float64).to(dtype)
    p = torch.nn.Parameter(start.clone())
    sgd = torch.optim.SGD([p], lr=0.1, fused=True)
    p.grad = torch.ones_like(p)
    sgd.step()
    ref = start.double() - 0.1
    allowed = 2 * u * (start.double().abs() + 0.1)
    ratio = float(((p.detach().double() - ref).abs() / allowed).max())
    unchanged = int((p.detach() == start).sum())
    print(f"{dtype}: {unchanged} of {p.numel()} elements unchanged by the step; worst error {ratio:.3g}x two roundings")
    worst = max(worst, ratio)
print(f"measured = {worst!r} (worst error over two roundings of the format); allowed = 1.0")
sys.exit(0 if worst <= 1.0 else 1)
