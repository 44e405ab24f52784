"""Several models, losses and optimizers with one GradScaler, standalone, as the AMP examples write
it: one backward per loss (``retain_graph=True`` for the first), ``unscale_`` and ``step`` per
optimizer, one ``update``. Each optimizer must skip only for its own non-finite gradients, a taken
step must equal, bit for bit, the same optimizer cloned with its state and stepped on the
gradients unscaled by hand (the scale is a power of two: exact), and an overflow must back the
scale off once.

amp-harness writes a failed check's device and the model whose gradient holds an inf over the
defaults below (``harness.domains.patterns.repro``); the models and data are seeded, as the check
builds them. As it lies the step is clean and both optimizers step as their references.
"""

import copy
import math

import torch
from torch import nn

# -- parameters --
DEVICE = torch.device("cpu")
OVERFLOW_IN: int | None = None  # the model whose first gradient holds an inf (None: none)
WIDTH = 16  # the models' width
BATCH = 8  # samples in the batch
SCALE = 2.0**8  # GradScaler's scale (a power of two)

# -- two_optimizers --


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, 1)).to(DEVICE)


def reference(opt: torch.optim.Optimizer, scale: float) -> list[torch.Tensor]:
    """The parameters ``opt``'s step must give: a clone stepped on the gradients unscaled by hand."""
    params = [p for g in opt.param_groups for p in g["params"]]
    clones = [p.detach().clone().requires_grad_(True) for p in params]
    for c, p in zip(clones, params, strict=True):
        c.grad = None if p.grad is None else p.grad.detach() * (1.0 / scale)
    ref = type(opt)(clones, **{k: v for k, v in opt.defaults.items() if k in ("lr", "momentum", "weight_decay")})
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))
    ref.step()
    return [c.detach() for c in clones]


m0, m1 = model(0), model(1)
opt0 = torch.optim.SGD(m0.parameters(), lr=0.1, momentum=0.9)
opt1 = torch.optim.AdamW(m1.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler(DEVICE.type, init_scale=SCALE, growth_interval=1000)
g = torch.Generator().manual_seed(2)
x, y = torch.randn(BATCH, WIDTH, generator=g).to(DEVICE), torch.randn(BATCH, 1, generator=g).to(DEVICE)
raised = None  # what the scaler raised: the observation, not a crash
for planted in (None, OVERFLOW_IN):  # a warm-up step, then the step judged
    for opt in (opt0, opt1):
        opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE.type, dtype=torch.float16):
        out0, out1 = m0(x), m1(x)
        loss0 = nn.functional.mse_loss((2 * out0 + 3 * out1).float(), y)
        loss1 = nn.functional.mse_loss((3 * out0 - 5 * out1).float(), y)
    torch.autograd.backward(scaler.scale(loss0), retain_graph=True)
    torch.autograd.backward(scaler.scale(loss1))
    if planted is not None:
        grad = next(iter((m0, m1)[planted].parameters())).grad
        assert grad is not None
        grad.view(-1)[0] = math.inf
    scale_before = scaler.get_scale()
    before = [[p.detach().clone() for p in m.parameters()] for m in (m0, m1)]
    refs = [reference(o, scale_before) for o in (opt0, opt1)]
    try:
        scaler.unscale_(opt0)  # the examples unscale one optimizer's gradients (to clip them), not the other's
        scaler.step(opt0)
        scaler.step(opt1)
        scaler.update()
    except Exception as exc:
        raised = f"{type(exc).__name__}: {exc}"
        break
problems = [f"raised {raised}"] if raised else []
for i, m in enumerate((m0, m1) if raised is None else ()):
    now = [p.detach() for p in m.parameters()]
    skipped = all(torch.equal(a, b) for a, b in zip(now, before[i], strict=True))
    as_reference = all(torch.equal(a, b) for a, b in zip(now, refs[i], strict=True))
    if skipped != (i == OVERFLOW_IN):
        problems.append(f"optimizer {i}: {'skipped' if skipped else 'stepped'} with an inf in model {OVERFLOW_IN}")
    elif not skipped and not as_reference:
        problems.append(f"optimizer {i}: stepped, unlike its reference")
factor = 1.0 if OVERFLOW_IN is None else 0.5
if raised is None and scaler.get_scale() != scale_before * factor:
    problems.append(f"scale {scale_before} -> {scaler.get_scale()}, expected x{factor}")
print(f"overflow in {OVERFLOW_IN}: " + ("; ".join(problems) or "each optimizer as promised"))
measured = len(problems)  # promises broken
allowed = 0
