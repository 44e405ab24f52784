import sys

import torch

# An autocast region's bf16/fp16 output shifted by a Python scalar, compiled. CPU eager rounds the
# scalar to the tensor's dtype (1.7 -> 1.703125 in bf16): at h = round(S), relu(h - S) is 0; at
# h = -round(S), clamp_min(h + S, 0) sits on its boundary (and passes its gradient where clamp's
# backward does), as margin_ranking_loss(margin=S) does at h = round(S). A compiler keeping S
# unrounded in fp32 moves them off the boundary: an element let through, a gradient silently
# zeroed (pytorch/pytorch#185517). Reference: eager, the same program uncompiled.
S = 1.7


def program(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.autocast("cpu", dtype=dtype):
        h = x @ torch.eye(x.shape[-1])  # x's values, in the autocast dtype
    ones = torch.ones_like(h[:, 1])
    loss = torch.clamp_min(h[:, 0] + S, 0).sum() + torch.nn.functional.margin_ranking_loss(
        h[:, 1], 0 * ones, ones, margin=S
    )
    return loss, (torch.relu(h[:, 2] - S) > 0).float()


def values(loss: torch.Tensor, mask: torch.Tensor, x: torch.Tensor) -> list[float]:
    (grad,) = torch.autograd.grad(loss, x)
    return [*grad[0, :2].tolist(), *mask.tolist()]


wrong = {}
for dtype in (torch.bfloat16, torch.float16):
    r = torch.tensor(S).to(dtype).item()  # the scalar rounded to the format: the inputs
    x = torch.tensor([[-r, r, r]], requires_grad=True)
    eager = values(*program(x, dtype), x)
    torch._dynamo.reset()
    compiled = values(*torch.compile(program)(x, dtype), x)
    print(f"{dtype}: [d clamp_min(h + {S}, 0) at {-r!r}, d margin_ranking_loss at {r!r}, relu({r!r} - {S}) > 0]: "
          f"compiled {compiled}, eager {eager}")  # fmt: skip
    if compiled != eager:
        wrong[str(dtype)] = compiled
sys.exit(1 if wrong else 0)
