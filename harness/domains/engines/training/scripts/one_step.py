"""One training step of a model, standalone: the model with saved weights (``model_at``) and the
loss of one batch ``(x, y)`` under autocast or in fp32 (``loss_of``), then what the check claims of
that step: the gradient census's, that torch's GradScaler skips a step whose scaled fp32 gradients
overflow fp16 and backs its scale off.

amp-harness writes a failed check's model, weights, batch and values over the defaults below
(``harness.domains.training.repro``); as it lies here it runs a small MLP.
"""

import torch
import torch.nn.functional as F
from torch import nn

# -- model --


def mlp(seed: int) -> nn.Module:  # the default model: a small MLP regression
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


LOSS = F.mse_loss

# -- inputs --
_gen = torch.Generator().manual_seed(0)
x, y = torch.randn(16, 8, generator=_gen), torch.randn(16, 1, generator=_gen) * 1e4  # the batch
WEIGHTS = mlp(0).state_dict()

# -- parameters --
MODEL = mlp  # builds the model from a seed
INIT_SEED = 0
DEVICE = "cpu"

# -- opening --


def model_at() -> nn.Module:  # the model with WEIGHTS, on DEVICE
    model = MODEL(INIT_SEED)
    model.load_state_dict(WEIGHTS)
    return model.to(DEVICE)


def loss_of(model: nn.Module, low: torch.dtype | None) -> torch.Tensor:  # the batch's loss, autocast to low
    with torch.autocast(DEVICE, dtype=low or torch.bfloat16, enabled=low is not None):
        out = model(x.to(DEVICE))
        return LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), y.to(DEVICE))


# -- census --
# the census's state: WEIGHTS, the model after its fp32 warm-up steps, and (x, y) the next step's batch
LR = 0.02
SCALE = 2.0**16  # the smallest loss scale 2^k at which the census found fp32 gradients beyond fp16's range
FP16_MAX = 65504.0  # (2 - 2^-10) x 2^15: fp16's largest finite value, from its bit layout

# reference: the fp32 gradients of this step, times SCALE, leave fp16's range
model = model_at()
torch.autograd.backward(loss_of(model, None))
largest = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
predicted = largest * SCALE > FP16_MAX
print(
    f"largest fp32 gradient {largest:.4g} x {SCALE:g} = {largest * SCALE:.4g} (fp16 max {FP16_MAX:g}): "
    f"{'overflow' if predicted else 'no overflow'} predicted"
)
# under test: torch's GradScaler at SCALE must skip this step (no parameter moves) and back off
model = model_at()
params = [p for p in model.parameters() if p.requires_grad]
before = [p.detach().clone() for p in params]
opt = torch.optim.SGD(params, lr=LR)
scaler = torch.amp.GradScaler(DEVICE, init_scale=SCALE)
torch.autograd.backward(scaler.scale(loss_of(model, torch.float16)))
scaler.step(opt)
scaler.update()
moved = sum(not torch.equal(p.detach(), b) for p, b in zip(params, before, strict=True))
print(
    f"GradScaler at {SCALE:g}: {moved} of {len(params)} parameters moved, scale after the step {scaler.get_scale():g}"
)
measured = int(predicted and (moved > 0 or not scaler.get_scale() < SCALE))  # 1: overflow predicted, no skip
allowed = 0
