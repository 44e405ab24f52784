"""Faults of the known-answers family: a card with a defective low-precision GEMM unit, a stuck output lane or an intermittent bit flip, as dispatcher kernels. Each is a factory ``fault(original) -> replacement`` or a
subclass wrong in one way, named by the negative controls that inject it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _gemm_kernels(post: Callable[[torch.Tensor], None]) -> Any:
    """aten::mm, addmm and bmm's CPU kernels with ``post`` applied to every bf16 result in place
    (a defective card's low-precision unit), other dtypes untouched, while the Library lives."""
    import warnings

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.mm.out(a, b, out=out)
        post(out)
        return out

    def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any = 1, alpha: Any = 1) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.addmm.out(c, a, b, beta=beta, alpha=alpha, out=out)
        post(out)
        return out

    def bmm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        torch.ops.aten.bmm.out(a, b, out=out)
        post(out)
        return out

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, kernel in (("mm", mm), ("addmm", addmm), ("bmm", bmm)):
            lib.impl(op, kernel, "CPU")  # type: ignore[no-untyped-call]
    return lib


#: the stuck lane: one output column in every STUCK_EVERY of a bf16 GEMM
STUCK_EVERY = 64


def register_bf16_gemm_stuck_lane() -> Any:
    """A card whose bf16 GEMM unit has a stuck lane: the lowest mantissa bit of one output column in
    every 64 is forced to 1 (at most one ulp, every call): no tolerance sees it."""

    def stuck(out: torch.Tensor) -> None:
        if out.dtype == torch.bfloat16:
            out[..., ::STUCK_EVERY].view(torch.int16).bitwise_or_(1)

    return _gemm_kernels(stuck)


#: the intermittent fault's rate: one bf16 GEMM call in this many has one bit flipped
FLIP_EVERY = 300


def register_bf16_gemm_intermittent_flip(seed: int = 0, every: float = FLIP_EVERY) -> Any:
    """A card that flips one bit (the lowest of the mantissa) of one element of a bf16 GEMM's result
    in about one call of ``every``, at random (seeded): a transient fault."""
    import random

    rng = random.Random(seed)

    def flip(out: torch.Tensor) -> None:
        if out.dtype == torch.bfloat16 and out.numel() and rng.random() < 1 / every:
            out.view(-1)[rng.randrange(out.numel())].view(torch.int16).bitwise_xor_(1)

    return _gemm_kernels(flip)


# -- a data-parallel job auditing itself (harness.api.ReplayAudit), with one rank's card faulty -----

#: the faults a rank program can give one rank, by name (``every``: the intermittent flip's rate)
RANK_FAULTS: dict[str, Callable[[float], Any]] = {
    "stuck_lane": lambda every: register_bf16_gemm_stuck_lane(),
    "intermittent": lambda every: register_bf16_gemm_intermittent_flip(seed=1, every=every),
}


def audited_ddp_training(
    rank: int,
    world: int,
    steps: int = 3,
    every: int = 2,
    fault: str | None = None,
    faulty_rank: int = 1,
    repeat: bool = True,
    drift_rank: int | None = None,
    nondeterministic: bool = False,
    log: str | None = None,
    flip_every: float = 3,
) -> list[dict[str, Any]]:
    """A user's DDP training in bf16 autocast with dropout, audited every ``every`` steps through the
    public API (not raising: the results come back). ``fault`` on ``faulty_rank``: a defective bf16
    GEMM unit (:data:`RANK_FAULTS`; the intermittent one flips a bit in one bf16 GEMM call in
    ``flip_every``: at 3, an audit step's 24 calls all but surely hold one). ``drift_rank``: that rank's optimizer step is one ulp off on one
    element after step 0 (its parameters leave DDP's). ``nondeterministic``: the loss draws noise
    from a generator the audit does not seed (a step that cannot be replayed bit for bit). ``log``:
    an :class:`~harness.api.AuditLog` path."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from harness.api import AuditLog, ReplayAudit

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(128, 128), torch.nn.GELU(),
        torch.nn.Linear(128, 8),
    )  # fmt: skip
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    noise = torch.Generator().manual_seed(12345 + rank)

    def loss_of(m: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        return loss * (1 + torch.rand((), generator=noise) * 1e-3) if nondeterministic else loss

    lib = RANK_FAULTS[fault](flip_every) if fault is not None and rank == faulty_rank else None
    record = AuditLog(log) if log is not None else None
    audit = ReplayAudit(loss_of, every=every, repeat=repeat, record=record, raise_on_failure=False)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        batch = (torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g))
        audit(step, model, batch)
        opt.zero_grad()
        loss_of(model, batch).backward()  # type: ignore[no-untyped-call]
        opt.step()
        if step == 0 and rank == drift_rank:
            with torch.no_grad():
                first = net[0]
                assert isinstance(first, torch.nn.Linear)
                w = first.weight.view(-1)
                w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))
    del lib
    return [r.as_dict() for r in audit.results]


def audited_ddp_scenarios(rank: int, world: int, scenarios: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """:func:`audited_ddp_training` once per scenario (its keyword arguments), in one launch of the
    ranks: each scenario builds its model afresh and its fault lives only while it runs."""
    return [audited_ddp_training(rank, world, **kw) for kw in scenarios]
