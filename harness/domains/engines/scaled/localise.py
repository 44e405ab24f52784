"""Where a training run in a scaled format left its band: at its first failed checkpoint, one step
from the fp32 run's weights then, what each linear of the model saw (:func:`seen_by_linears`), and
the first linear whose products leave their budget (:class:`Localised`, found by the family's own
products: float8's or a block-scaled linear's), recorded as a row beside the failed claim."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from harness.domains.engines.scaled.matmul import ScaledBudget, sqnr
from harness.domains.engines.training.loop import train
from harness.domains.engines.training.parity import Parity
from harness.domains.engines.training.recipes import FP32, Setup
from harness.domains.repro import FailureRepro


def over_budget(actual: torch.Tensor, reference: torch.Tensor, bud: ScaledBudget) -> float:
    """How far a product is over its budget, as its script measures it: the worst element in units
    of its bound, or the SQNR floor over the SQNR reached, whichever is larger (at most 1: within)."""
    got = actual.detach().double().cpu()
    worst = float(((got - reference).abs() / bud.bound).max())
    measured = sqnr(got, reference)
    return max(worst, bud.sqnr_floor_db / measured if measured > 0 else math.inf)


@dataclass(frozen=True)
class Localised:
    """The first linear (in forward order) of one low-precision step whose product leaves its
    budget: its module path, the product, the worst element over its bound, and the script (None:
    the linear is yours, which a script cannot run)."""

    module: str
    gemm: str
    worst: float
    linears: int
    repro: FailureRepro | None

    def explain(self) -> str:
        return (
            f"first linear over its budget: {self.module} ({self.gemm}: worst element {self.worst:.3g} x its "
            f"bound), of {self.linears} linears in one step"
        )


@dataclass(frozen=True)
class Seen:
    """What one linear of a model saw in a step: its input and output gradient (as matrices: the
    leading dimensions flattened), and its weight."""

    path: str
    x: torch.Tensor
    w: torch.Tensor
    go: torch.Tensor


def seen_by_linears(
    model: nn.Module, step: Callable[[], torch.Tensor], kind: type[nn.Module] = nn.Linear
) -> list[Seen]:
    """Run ``step`` (a forward returning the loss) and its backward on ``model``: what each module
    of ``kind`` saw, in forward order (a module that got no gradient is left out)."""
    seen: dict[str, dict[str, torch.Tensor]] = {}
    handles = []
    for path, module in model.named_modules():
        if not isinstance(module, kind):
            continue

        def keep(mod: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor, path: str = path) -> None:
            seen[path] = {"x": args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu()}

            def keep_grad(go: torch.Tensor) -> None:  # the output's gradient (a tensor hook: no module hook)
                seen[path]["go"] = go.detach().reshape(-1, go.shape[-1]).float().cpu()

            out.register_hook(keep_grad)  # type: ignore[no-untyped-call]

        handles.append(module.register_forward_hook(keep))
    try:
        step().backward()  # type: ignore[no-untyped-call]
    finally:
        for h in handles:
            h.remove()
    modules = dict(model.named_modules())
    out = []
    for path, got in seen.items():
        weight = modules[path].weight
        if "go" in got and isinstance(weight, torch.Tensor):
            out.append(Seen(path, got["x"], weight.detach().float().cpu(), got["go"]))
    return out


def fp32_state_at(setup: Setup, step: int, device: torch.device | str = "cpu") -> tuple[dict[str, torch.Tensor], Any]:
    """Where a low-precision run is localised: the fp32 run's weights after ``step`` (seed 0), and
    the evaluation batch the training suite's diagnosis steps on."""

    weights = train(setup, FP32, 0, torch.device(device), keep_weights_at=frozenset({step})).weights[step]
    return weights, setup.eval_batch("cpu")


class _Record(Protocol):
    """What :func:`localised_row` uses of the suite's ``amp_record``: a row, and a script's tags."""

    def __call__(self, metric: str, value: float, **kwargs: Any) -> Any: ...

    def repro_tags(self, repro: FailureRepro | None) -> dict[str, Any]: ...


def first_failed_step(p: Parity) -> int:
    """The first checkpoint of a run that left its band (one that did: a failed claim)."""
    step = p.first_failed_step
    if step is None:
        raise ValueError(f"{p.recipe} stayed within its band at every checkpoint: nothing to localise")
    return step


def localised_row(
    record: _Record,
    metric: str,
    step: int,
    locate: Callable[[], tuple[Localised | None, int]],
    device: torch.device | str,
    tags: dict[str, Any],
) -> str:
    """For a failed training claim: ``locate`` the first linear over its budget at ``step``,
    record it as ``<metric>.first_linear_over_budget`` (the row keeps its script: ``record`` is
    the suite's ``amp_record``) and say it in a line for the failure."""
    try:
        found, judged = locate()
    except Exception as exc:  # the verdict stands; a localisation that cannot run must not hide it
        return f"(no localisation: {type(exc).__name__}: {exc})"
    if found is None:
        return (
            f"at step {step} no linear's products leave their budget ({judged} judged): what failed is not one "
            "product's error beyond its formats' budget"
        )
    repro_tags = record.repro_tags(found.repro)
    record(
        f"{metric}.first_linear_over_budget",
        found.worst,
        unit="x bound",
        allowance=1.0,
        device=device,
        tags={**tags, "module": found.module, "gemm": found.gemm, "step": step, **repro_tags},
        note=found.explain(),
    )
    return f"at step {step}, {found.explain()}"
