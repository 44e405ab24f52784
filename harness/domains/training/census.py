"""Why fp16 needs loss scaling: a census of fp32 gradient magnitudes against fp16's range."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.domains.engines.training.models import SETUPS
from harness.domains.engines.training.recipes import DATA_SEED_OFFSET, Setup, to_device
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP16

FP16_TINY = FP16.smallest_subnormal  # 2^-24: below half of it a value flushes to zero
FP16_MIN_NORMAL = FP16.smallest_normal  # 2^-14


#: Loss scales of the census: 2^0 .. 2^24 (2^24 lifts fp16's smallest subnormal to 1).
CENSUS_SCALES: tuple[float, ...] = tuple(2.0**e for e in range(25))


def gradient_census(grads: Sequence[torch.Tensor], scales: Sequence[float] = CENSUS_SCALES) -> dict[str, Any]:
    """Shares of fp32 gradient values that fp16 would flush to zero or hold as subnormals, and per
    loss scale S the share still flushed and the share that overflows (|g| S > fp16 max)."""
    g = torch.cat([t.detach().float().abs().flatten() for t in grads]).double()
    n = g.numel()
    nonzero = g[g > 0]
    out: dict[str, Any] = {
        "values": n,
        "exact_zero_share": float((g == 0).sum()) / n,
        "underflow_share": float((nonzero < FP16_TINY / 2).sum()) / n,
        "subnormal_share": float(((nonzero >= FP16_TINY / 2) & (nonzero < FP16_MIN_NORMAL)).sum()) / n,
        "log2_quantiles": {q: float(torch.log2(nonzero.quantile(q))) for q in (0.01, 0.5, 0.99)}
        if nonzero.numel()
        else {},
        "per_scale": [],
    }
    for s in scales:
        scaled = nonzero * s
        out["per_scale"].append(
            {
                "scale_log2": round(math.log2(s)),
                "underflow_share": float((scaled < FP16_TINY / 2).sum()) / n,
                "recovered_share": out["underflow_share"] - float((scaled < FP16_TINY / 2).sum()) / n,
                "overflow_share": float((scaled > FP16.max).sum()) / n,
            }
        )
    return out


@dataclass(frozen=True)
class CensusState:
    """Where the census looks: the model after a few fp32 steps, and the batch of the next one."""

    model: nn.Module
    inputs: Any
    targets: Any


def census_state(setup: Setup, seed: int = 0, warmup_steps: int = 5, device: torch.device | str = "cpu") -> CensusState:
    """The model after ``warmup_steps`` fp32 steps of ``setup`` and the next step's batch."""
    torch.manual_seed(seed)
    model = setup.build(device)
    opt = setup.make_optimizer(list(model.parameters()), setup.lr)
    gen = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
    for step in range(warmup_steps):
        x, y = to_device(setup.batch(step, gen), torch.device(device))
        opt.zero_grad()
        setup.loss_on(model, x, y).backward()  # type: ignore[no-untyped-call]
        opt.step()
    x, y = to_device(setup.batch(warmup_steps, gen), torch.device(device))
    model.zero_grad(set_to_none=True)
    return CensusState(model, x, y)


def fp32_gradients(
    setup: Setup, seed: int = 0, warmup_steps: int = 5, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """fp32 parameter gradients after a few fp32 steps (the census input)."""
    at = census_state(setup, seed, warmup_steps, device)
    setup.loss_on(at.model, at.inputs, at.targets).backward()  # type: ignore[no-untyped-call]
    return [p.grad.detach().clone() for p in at.model.parameters() if p.grad is not None]


def scaler_skips_at(setup: Setup, scale: float, seed: int = 0, device: torch.device | str = "cpu") -> bool:
    """From the census's state, one fp16-autocast step of SGD at the setup's learning rate with
    torch's GradScaler at ``scale``: whether it skipped (no parameter moved) and backed off."""
    at = census_state(setup, seed, device=device)
    params = [p for p in at.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=setup.lr)
    dev = torch.device(device)
    scaler = torch.amp.GradScaler(dev.type, init_scale=scale)
    with torch.autocast(dev.type, dtype=torch.float16):
        loss = setup.loss_on(at.model, at.inputs, at.targets)
    scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
    scaler.step(opt)
    scaler.update()
    unmoved = all(bool(torch.equal(p.detach(), b)) for p, b in zip(params, before, strict=True))
    return unmoved and scaler.get_scale() < scale


def lm_gradients(seed: int = 0) -> list[torch.Tensor]:
    """The tiny language model's fp32 gradients after 5 steps."""
    return fp32_gradients(SETUPS["tiny_lm"], seed)


# -- the claims: the census's verdicts, decided here -------------------------------------------------
def census_claims(census: Mapping[str, Any]) -> list[ClaimComparison]:
    """What a census over loss scales (:func:`gradient_census`) must show of any model: a larger
    scale never flushes more gradients to zero nor overflows fewer, and scale 2^0 keeps the
    unscaled census's underflow share."""
    per = census["per_scale"]
    under = [r["underflow_share"] for r in per]
    over = [r["overflow_share"] for r in per]
    grows = sum(a < b for a, b in itertools.pairwise(under))
    shrinks = sum(a > b for a, b in itertools.pairwise(over))
    return [
        compare_claim(
            "lm.grad.underflow_share_monotone_in_the_scale",
            grows,
            grows == 0,
            "a larger loss scale never flushes more gradients to zero in fp16",
            detail=f"underflow shares by scale: {under}",
            expected=0,
            allowance=0,
            unit="increases",
        ),
        compare_claim(
            "lm.grad.overflow_share_monotone_in_the_scale",
            shrinks,
            shrinks == 0,
            "a larger loss scale never overflows fewer gradients in fp16",
            detail=f"overflow shares by scale: {over}",
            expected=0,
            allowance=0,
            unit="decreases",
        ),
        compare_claim(
            "lm.grad.scale_one_keeps_the_underflow_share",
            abs(per[0]["underflow_share"] - census["underflow_share"]),
            per[0]["underflow_share"] == census["underflow_share"],
            "scale 2^0 leaves the underflow share as the unscaled census measured it",
            detail=f"{per[0]['underflow_share']} at scale 2^0, {census['underflow_share']} unscaled",
            expected=0,
            allowance=0,
            unit="share",
        ),
    ]


def scaler_skip_claim(skipped: bool, scale: float) -> ClaimComparison:
    """GradScaler skips and backs off at ``scale``, the first where the census predicts fp16
    overflow of parameter gradients (``skipped``: :func:`scaler_skips_at`)."""
    return compare_claim(
        "lm.scaler_skips_where_census_predicts_overflow",
        skipped,
        skipped,
        "GradScaler skips the step and backs off at the first scale where the census predicts fp16 overflow",
        detail=f"the census predicts fp16 overflow of parameter gradients at scale {scale}, but "
        "GradScaler did not skip the step and back off",
    )
