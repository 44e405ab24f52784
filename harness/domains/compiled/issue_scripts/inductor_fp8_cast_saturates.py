import math
import sys

import torch

# Casting to float8 must give the same bits compiled and eager. Eager overflows (e4m3fn: NaN, e5m2:
# inf); Inductor's CUDA cast (Triton) saturates at the largest finite value. Reference: eager's cast.
# Runs on CUDA where there is one (the device); on the CPU it shows what the CPU does.
device = "cuda" if torch.cuda.is_available() else "cpu"
x = torch.tensor([1.0, 1000.0, 3.0e38, math.inf, -1000.0, -math.inf], device=device)


def cast(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float8_e4m3fn)


eager = cast(x)
compiled = torch.compile(cast)(x)
e_bits, c_bits = eager.view(torch.uint8).tolist(), compiled.view(torch.uint8).tolist()
differ = [(float(v), hex(e), hex(c)) for v, e, c in zip(x.tolist(), e_bits, c_bits, strict=True) if e != c]
print(f"fp32 -> float8_e4m3fn on {device}, eager vs compiled bits (input, eager, compiled): {differ or 'all equal'}")
sys.exit(1 if differ else 0)
