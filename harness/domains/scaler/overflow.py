"""Overflow in AMP training with a GradScaler: a tiny fp16-autocast model with injection points
(a huge activation in the forward, an inf gradient in the backward, an inf loss), its scale and
skip trace against the reference state machine, and the scaler's recorded hazards (a scale that
reaches 0, a scale below 2^-128, a NaN loss with finite gradients), each decided here as a claim
the suite records."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from harness.domains.scaler import reference as scaling
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP16

#: the scaler's growth interval: short, so that growth shows within :data:`STEPS`
GROWTH_INTERVAL = 2
#: the step an overflow is injected at, and the steps of a run
INJECT_AT = 3
STEPS = 8


@dataclass
class Trainer:
    """A tiny fp16-autocast regression model trained with a GradScaler, with injection points."""

    device: torch.device
    scaler_cls: type[torch.amp.GradScaler]
    inject: Callable[[int, str], str | None] = lambda step, where: None

    def __post_init__(self) -> None:
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(8, 16).to(self.device), torch.nn.Linear(16, 1).to(self.device)
        self.params = [*self.l1.parameters(), *self.l2.parameters()]
        self.opt = torch.optim.AdamW(self.params, lr=1e-2)
        self.scaler = self.scaler_cls(self.device.type, growth_interval=GROWTH_INTERVAL)
        g = torch.Generator().manual_seed(1)
        self.x, self.y = (
            torch.randn(32, 8, generator=g).to(self.device),
            torch.randn(32, 1, generator=g).to(self.device),
        )
        self.step_no = 0
        self.l2.weight.register_hook(self._grad_hook)  # type: ignore[no-untyped-call]

    def _grad_hook(self, grad: torch.Tensor) -> torch.Tensor:
        if self.inject(self.step_no, "backward") == "inf":
            grad = grad.clone()
            grad.view(-1)[0] = math.inf
        return grad

    def step(self) -> dict[str, float | bool | int]:
        self.opt.zero_grad()
        before = [p.detach().clone() for p in self.params]
        scale = self.scaler.get_scale()
        with torch.autocast(self.device.type, dtype=torch.float16):
            h = torch.relu(self.l1(self.x))
            if self.inject(self.step_no, "forward") == "huge":
                h = h * (FP16.max * 4)  # fp16 activations beyond 65504 -> inf
            loss = torch.nn.functional.mse_loss(self.l2(h).float(), self.y)
        if self.inject(self.step_no, "loss") == "inf":
            loss = loss * math.inf
        self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        self.scaler.step(self.opt)
        self.scaler.update()
        skipped = all(torch.equal(b, p) for b, p in zip(before, self.params, strict=True))
        row = {"step": self.step_no, "scale": scale, "skipped": skipped, "loss": loss.detach().item()}
        self.step_no += 1
        return row


def inject_at(step: int, where: str, what: str) -> Callable[[int, str], str | None]:
    return lambda s, w: what if (s == step and w == where) else None


def expected_trace(steps: int = STEPS, overflow_at: int = INJECT_AT) -> list[dict[str, float | bool | int]]:
    """The reference state machine's scales and skips for one overflow at ``overflow_at``."""
    cfg = scaling.ScalerConfig(growth_interval=GROWTH_INTERVAL)
    ref = scaling.ScalerState.initial(cfg)
    expected: list[dict[str, float | bool | int]] = []
    for s in range(steps):
        expected.append({"step": s, "scale": ref.scale, "skipped": s == overflow_at})
        ref = scaling.update("torch", cfg, ref, s == overflow_at)
    return expected


def recovery_claim(where: str, trace: list[dict[str, float | bool | int]]) -> ClaimComparison:
    """The trace of a run with one overflow at :data:`INJECT_AT` equals the reference's: skipped,
    backed off, then a step taken at once (the value: steps until one is taken again)."""
    expected = expected_trace(len(trace))
    got = [{k: r[k] for k in ("step", "scale", "skipped")} for r in trace]
    recovered = next(
        (int(r["step"]) - INJECT_AT for r in trace if int(r["step"]) > INJECT_AT and not r["skipped"]), None
    )
    return compare_claim(
        f"recovery_steps.{where}",
        recovered if recovered is not None else math.inf,
        got == expected,
        "steps after the overflow until a step is taken again; the whole trace equals the reference",
        detail=[
            f"step {g['step']}: got scale {g['scale']} skipped={g['skipped']}, expected scale {e['scale']} skipped={e['skipped']}"
            for g, e in zip(got, expected, strict=True)
            if g != e
        ],
        expected=1,
        allowance=0,
    )


# -- hazards: recorded findings, each a claim that the finding still holds ------------------------
def _overflow_update(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    scaler.scale(p.sum()).backward()  # type: ignore[no-untyped-call]
    p.grad.view(-1)[0] = math.inf  # type: ignore[union-attr]
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def _clean_update(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer, p: torch.nn.Parameter) -> None:
    scaler.scale((p * p).sum()).backward()  # type: ignore[no-untyped-call]
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def zero_scale_findings(scaler: torch.amp.GradScaler, device: torch.device) -> list[ClaimComparison]:
    """Overflow until the scale is 0 (it has no floor), then one clean step: the scale reaches
    exactly 0 after the reference's count, and the step writes NaN into the parameters."""
    cfg = scaling.ScalerConfig()
    n = scaling.steps_to_zero(cfg)
    p = torch.nn.Parameter(torch.ones(4, device=device))
    opt = torch.optim.SGD([p], lr=0.1)
    for _ in range(n):
        _overflow_update(scaler, opt, p)
    at_zero = scaler.get_scale()
    _clean_update(scaler, opt, p)
    corrupted = bool(p.detach().isnan().any())
    return [
        compare_claim(
            "overflows_to_zero_scale",
            n,
            at_zero == 0.0,
            "consecutive overflows from 2^16 at backoff 0.5 until the float32 scale is 0",
            detail=f"after {n} overflows the scale is {at_zero}, the reference says 0.0",
            expected=n,
            allowance=0,
        ),
        compare_claim(
            "zero_scale_nan_undetected",
            corrupted,
            corrupted,
            "scale 0: unscaling makes NaN after the inf check; the step writes NaN into the parameters",
            detail="with a zero scale the step left the parameters finite: the zero-scale finding changed, update it",
            finding=True,
        ),
    ]


def tiny_scale_finding(scaler: torch.amp.GradScaler, device: torch.device) -> ClaimComparison:
    """update(2^-130), then a clean step: 1/scale is inf in float32, so unscaling turns finite
    gradients into inf after the inf check and the step writes inf into the parameters."""
    p = torch.nn.Parameter(torch.ones(4, device=device))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler.scale(p.sum()).backward()  # type: ignore[no-untyped-call]
    scaler.step(opt)
    scaler.update(2.0**-130)
    opt.zero_grad()
    _clean_update(scaler, opt, p)
    corrupted = not bool(p.detach().isfinite().all())
    return compare_claim(
        "tiny_scale_inf_undetected",
        corrupted,
        corrupted,
        "inv_scale = 1/scale is inf in float32 below 2^-128",
        detail="after update(2^-130) a clean step left the parameters finite: the finding changed, update it",
        finding=True,
    )


def nan_loss_finding(scaler: torch.amp.GradScaler, device: torch.device) -> ClaimComparison:
    """A loss NaN through a detached term, its gradients finite: GradScaler inspects gradients
    only, so the step is taken."""
    p = torch.nn.Parameter(torch.ones(4, device=device))
    opt = torch.optim.SGD([p], lr=0.1)
    loss = (p * p).sum() + torch.tensor(math.nan, device=device).detach()
    before = p.detach().clone()
    scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
    scaler.step(opt)
    scaler.update()
    taken = not torch.equal(before, p.detach())
    return compare_claim(
        "nan_loss_finite_grads_step_taken",
        taken,
        math.isnan(loss.detach().item()) and taken,
        "the loss was NaN, the gradients finite: the step was taken and the scale kept",
        detail="a NaN loss with finite gradients was skipped: the finding changed, update it",
        finding=True,
    )
