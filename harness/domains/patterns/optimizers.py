"""Several models, losses and optimizers with one GradScaler, as the AMP examples write it: one
backward per loss (``retain_graph=True`` for the first), ``unscale_`` and ``step`` per optimizer,
one ``update``. Each optimizer checks its own gradients for inf/NaN and decides its own skip; an
overflow in one backs the scale off once.

Reference for a step that is taken: the same optimizer, cloned with its state before the step,
stepped on the gradients unscaled by hand (the scale is a power of two: unscaling is exact), so
the step must match it bit for bit."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

WIDTH, BATCH = 16, 8
SCALE = 2.0**8


def _model(seed: int, device: torch.device) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, 1)).to(device)


def _optimizers(m0: nn.Module, m1: nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    return torch.optim.SGD(m0.parameters(), lr=0.1, momentum=0.9), torch.optim.AdamW(m1.parameters(), lr=1e-2)


@dataclass(frozen=True)
class Outcome:
    """What the step did to each optimizer, and to the scale."""

    #: per optimizer: "stepped as its reference", "skipped", or what went wrong
    optimizers: tuple[str, str]
    scale_before: float
    scale_after: float
    error: str | None = None


def _reference(opt: torch.optim.Optimizer, make: type[torch.optim.Optimizer], scale: float) -> list[torch.Tensor]:
    """The parameters ``opt``'s step must give: a clone stepped on the gradients unscaled by hand."""
    params = [p for g in opt.param_groups for p in g["params"]]
    clones = [p.detach().clone().requires_grad_(True) for p in params]
    for c, p in zip(clones, params, strict=True):
        c.grad = None if p.grad is None else p.grad.detach() * (1.0 / scale)
    ref = make(clones, **{k: v for k, v in opt.defaults.items() if k in ("lr", "momentum", "weight_decay")})
    ref.load_state_dict(copy.deepcopy(opt.state_dict()))  # its buffers, not opt's: a step mutates them
    ref.step()
    return [c.detach() for c in clones]


def step_with_overflow_in(overflow_in: int | None, device: torch.device) -> Outcome:
    """A warm-up step, then one step of the documented two-model pattern under fp16 autocast with an
    inf planted in model ``overflow_in``'s gradient (None: clean)."""
    m0, m1 = _model(0, device), _model(1, device)
    opt0, opt1 = _optimizers(m0, m1)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE, growth_interval=1000)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(BATCH, WIDTH, generator=g).to(device), torch.randn(BATCH, 1, generator=g).to(device)
    for planted in (None, overflow_in):
        for opt in (opt0, opt1):
            opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16):
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
        refs = [_reference(o, type(o), scale_before) for o in (opt0, opt1)]
        try:
            scaler.unscale_(opt0)  # the examples unscale one optimizer's gradients (to clip them), not the other's
            scaler.step(opt0)
            scaler.step(opt1)
            scaler.update()
        except Exception as exc:  # what the scaler raised is the observation
            return Outcome(("", ""), scale_before, scale_before, f"{type(exc).__name__}: {exc}")
    verdicts = []
    for i, m in enumerate((m0, m1)):
        now = [p.detach() for p in m.parameters()]
        if all(torch.equal(a, b) for a, b in zip(now, before[i], strict=True)):
            verdicts.append("skipped")
        elif all(torch.equal(a, b) for a, b in zip(now, refs[i], strict=True)):
            verdicts.append("stepped as its reference")
        else:
            verdicts.append("stepped, unlike its reference")
    return Outcome((verdicts[0], verdicts[1]), scale_before, scaler.get_scale())
