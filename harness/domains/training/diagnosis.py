"""Where an AMP run departs from fp32: per-module attribution of a parity failure.

At the first failing checkpoint, the fp32 reference's weights are loaded twice; the same
evaluation batch runs forward and backward once in fp32 and once under the recipe's autocast.
Forward hooks record every module's output (in the order modules finish, a module called twice
counted twice), and each module's own parameter gradients are compared. Errors are relative:
``||amp - fp32|| / ||fp32||``. Two errors per module:

- *propagated*: the module's output in the AMP run against the fp32 run (what the run sees:
  everything upstream plus the module's own part);
- *local*: the module alone, fed the fp32 run's inputs in the dtypes the AMP run gave it, under
  autocast, against its fp32 output: its own contribution. For a container (a module with
  children) its children run exactly (in fp32, outside autocast) and hand on their outputs in the
  dtypes the AMP run gave them, so what remains is what the container's own ``forward`` adds
  beyond its children's error: an overflow written inline (``z.pow(2).mean(-1)``) is found in the
  block that writes it, not in the next module with parameters.

Local errors are stated in units of ``u``, the unit roundoff of the autocast dtype: a module that
only rounds its output to that dtype contributes ~1 u. The *departure* is the module with the
largest local error, the place where the AMP run's error jumps; no threshold is involved. Then the
usual remedy is tried once: the recipe is trained again with that module outside autocast (fp32
inputs and computation), and the parity ratio before and after is reported.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.domains.training.batches import cast_floating, tensors, tree_map
from harness.domains.training.loop import train
from harness.domains.training.ops import OpPrint, first_over_budget, localised, record_step
from harness.domains.training.parity import Band, RecipeResult, parity
from harness.domains.training.recipes import Recipe, Setup
from harness.numerics.formats import format_of

ROOT = "(model)"


@dataclass(frozen=True)
class ModuleError:
    """One module call: its relative forward errors and its parameters' relative gradient error."""

    name: str
    kind: str
    order: int
    #: propagated: the module's output in the AMP run against the fp32 run
    forward: float
    #: None where the module has no parameters of its own
    grad: float | None
    #: its own contribution (a container's: beyond its children's), relative
    local: float | None = None


@dataclass(frozen=True)
class Remedy:
    """The parity ratio of the recipe before and after running one module outside autocast."""

    module: str
    worst_before: float
    worst_after: float

    @property
    def fixes(self) -> bool:
        return self.worst_after <= 1.0


@dataclass(frozen=True)
class Diagnosis:
    setup: str
    recipe: str
    step: int
    unit_roundoff: float
    modules: tuple[ModuleError, ...]
    departure: ModuleError | None
    remedy: Remedy | None
    #: the first aten op of the AMP step whose own error against float64 leaves its budget
    #: (:mod:`harness.domains.training.ops`); None where every op stays within it
    first_op: OpPrint | None = None
    #: how many aten ops that step ran
    ops_seen: int = 0

    def ranked(self, n: int = 5) -> list[ModuleError]:
        """The ``n`` module calls with the largest local error (their own contribution)."""
        return sorted((m for m in self.modules if m.local is not None), key=lambda m: -(m.local or 0.0))[:n]

    def explain(self) -> str:
        lines = [
            f"diagnosis of {self.setup} / {self.recipe} at step {self.step} (fp32 weights of that step, evaluation "
            f"batch, relative errors against fp32; unit roundoff u = {self.unit_roundoff:.3g}):"
        ]
        u = self.unit_roundoff
        if self.departure is not None:
            d = self.departure
            lines.append(
                f"  the AMP run departs at {d.name} ({d.kind}): its own error {(d.local or 0.0) / u:.3g} u, output "
                f"error {d.forward:.3g}" + (f", parameter-gradient error {d.grad:.3g}" if d.grad is not None else "")
            )
        lines.append(
            "  largest own errors: "
            + "; ".join(f"{m.name} ({m.kind}) {(m.local or 0.0) / u:.3g} u" for m in self.ranked())
        )
        if self.ops_seen:
            lines.append(f"  {localised(self.first_op, self.ops_seen)}")
        output = max(self.modules, key=lambda m: m.order, default=None)
        if output is not None:
            lines.append(f"  error at the output: {output.forward:.3g} ({output.forward / u:.3g} u)")
        if self.remedy is not None:
            r = self.remedy
            lines.append(
                f"  remedy tried: {r.module} outside autocast: worst parity ratio {r.worst_before:.3g} -> "
                f"{r.worst_after:.3g} ({'passes' if r.fixes else 'still fails'})"
            )
        return "\n".join(lines)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.detach().double(), b.detach().double()
    if a64.shape != b64.shape:
        return math.inf
    ref = float(b64.norm())
    diff = float((a64 - b64).norm())
    return diff / ref if ref > 0 else (0.0 if diff == 0 else math.inf)


def _first_floating(output: Any) -> torch.Tensor | None:
    return next((t for t in tensors(output) if t.is_floating_point()), None)


@dataclass
class _Call:
    label: str
    module: str
    kind: str
    leaf: bool
    output: torch.Tensor
    #: the call's inputs as they arrived (detached copies), for the local error
    args: Any
    kwargs: Any


def _observe(
    setup: Setup, model: nn.Module, inputs: Any, targets: Any, dtype: torch.dtype | None, loss_scale: float
) -> tuple[list[_Call], dict[str, torch.Tensor]]:
    """(module calls in completion order), and per-module own-parameter gradients."""
    calls: list[_Call] = []
    seen: dict[str, int] = {}
    pending: dict[int, list[tuple[Any, Any]]] = {}
    handles = []

    def snapshot(obj: Any) -> Any:
        return tree_map(lambda t: t.detach().clone(), obj)

    for name, module in model.named_modules():
        leaf = not any(True for _ in module.children())

        def pre(mod: nn.Module, args: Any, kwargs: Any) -> None:
            # before the call: an in-place module (ReLU(inplace=True)) overwrites its input
            pending.setdefault(id(mod), []).append((snapshot(args), snapshot(kwargs)))

        def hook(
            mod: nn.Module, args: Any, kwargs: Any, output: Any, _name: str = name or ROOT, _leaf: bool = leaf
        ) -> None:
            arrived = pending[id(mod)].pop()
            out = _first_floating(output)
            if out is None:
                return
            seen[_name] = seen.get(_name, 0) + 1
            label = _name if seen[_name] == 1 else f"{_name}#{seen[_name]}"
            calls.append(_Call(label, _name, type(mod).__name__, _leaf, out.detach().clone(), *arrived))

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    device = next(model.parameters()).device
    try:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = setup.loss_on(model, inputs, targets)
        (loss * loss_scale).backward()  # type: ignore[no-untyped-call]
    finally:
        for h in handles:
            h.remove()
    grads: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        # a parameter without a gradient (a fault that drops it from the graph) counts as zero
        own = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).detach().double().flatten() / loss_scale
            for p in module.parameters(recurse=False)
        ]
        if own:
            grads[name or ROOT] = torch.cat(own)
    return calls, grads


def attribute(
    setup: Setup,
    recipe: Recipe,
    weights: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
    loss_scale: float = 1.0,
) -> tuple[float, list[ModuleError]]:
    """Per-module relative errors of ``recipe``'s autocast against fp32 at ``weights``."""
    dev = torch.device(device)
    base = setup.build(dev)
    base.load_state_dict(weights)
    inputs, targets = setup.eval_batch(dev)
    amp_model = copy.deepcopy(base)
    ref_calls, ref_grads = _observe(setup, copy.deepcopy(base), inputs, targets, None, 1.0)
    amp_calls, amp_grads = _observe(setup, amp_model, inputs, targets, recipe.dtype, loss_scale)
    u = format_of(recipe.dtype or torch.bfloat16).unit_roundoff
    reference = {c.label: c for c in ref_calls}
    named = dict(amp_model.named_modules())
    named[ROOT] = amp_model
    out_dtypes: dict[str, torch.dtype] = {}
    for c in amp_calls:
        out_dtypes.setdefault(c.module, c.output.dtype)
    modules: list[ModuleError] = []
    for order, call in enumerate(amp_calls):
        ref = reference.get(call.label)
        if ref is None:
            continue
        grad = (
            _relative(amp_grads[call.module], ref_grads[call.module])
            if call.module in amp_grads and call.module in ref_grads
            else None
        )
        local = _local_error(named.get(call.module), call.module, ref, call, recipe.dtype, dev, out_dtypes)
        modules.append(ModuleError(call.label, call.kind, order, _relative(call.output, ref.output), grad, local))
    return u, modules


def _like(values: Any, dtypes_of: Any) -> Any:
    """``values`` (the fp32 run's inputs) in the dtypes of ``dtypes_of`` (the AMP run's inputs)."""
    dtypes = iter([t.dtype for t in tensors(dtypes_of)])
    return tree_map(lambda t: t.to(next(dtypes, t.dtype)), values)


def _local_error(
    module: nn.Module | None,
    name: str,
    ref: _Call,
    amp: _Call,
    dtype: torch.dtype | None,
    device: torch.device,
    out_dtypes: dict[str, torch.dtype],
) -> float | None:
    """The module's own error: run alone on the fp32 run's inputs (in the AMP run's dtypes) under
    autocast, its children exact (fp32, outside autocast, handing on the AMP run's dtypes)."""
    if module is None:
        return None
    args, kwargs = _like(ref.args, amp.args), _like(ref.kwargs, amp.kwargs)
    prefix = "" if name == ROOT else f"{name}."
    with (
        torch.no_grad(),
        _exact_children(module, prefix, out_dtypes),
        torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None),
    ):
        out = _first_floating(module(*args, **kwargs))
    return None if out is None else _relative(out, ref.output)


@contextlib.contextmanager
def _exact_children(module: nn.Module, prefix: str, out_dtypes: dict[str, torch.dtype]) -> Iterator[None]:
    """Within it, each direct child of ``module`` computes in fp32 outside autocast and returns its
    floating outputs in the dtype the AMP run's call of it gave (fp32 where it was not called)."""
    saved = []
    for child_name, child in module.named_children():
        dtype = out_dtypes.get(prefix + child_name, torch.float32)
        inner = child.forward

        def forward(*a: Any, _inner: Any = inner, _dtype: torch.dtype = dtype, **k: Any) -> Any:
            device = next((t.device for t in tensors((a, k))), torch.device("cpu"))
            with torch.autocast(device.type, enabled=False):
                out = _inner(*cast_floating(a, torch.float32), **cast_floating(k, torch.float32))
            return tree_map(lambda t: t.to(_dtype) if t.is_floating_point() else t, out)

        saved.append((child, inner))
        child.forward = forward
    try:
        yield
    finally:
        for child, inner in saved:
            child.forward = inner


def diagnose(setup: Setup, result: RecipeResult, band: Band, device: torch.device | str = "cpu") -> Diagnosis:
    """Attribute a failed parity verdict to a module, and try running that module in fp32."""
    p = result.parity
    failed = p.first_failed_step
    step = p.steps[-1] if failed is None else failed
    cp = result.recipe.fp32_counterpart()
    reference = train(setup, cp, 0, device, frozenset(result.run.skipped_at), keep_weights_at=frozenset({step}))
    scale = result.run.scales[step] if result.recipe.scaler and step < len(result.run.scales) else 1.0
    u, modules = attribute(setup, result.recipe, reference.weights[step], device, scale)
    ops = localise(setup, result.recipe, reference.weights[step], device)
    judged = [m for m in modules if m.local is not None]
    departure = max(judged, key=lambda m: (m.local or 0.0, -m.order)) if judged else None
    remedy = None
    if departure is not None and departure.name.split("#")[0] != ROOT:
        module = departure.name.split("#")[0]
        rerun = train(setup, result.recipe, 0, device, fp32_modules=(module,))
        reference = result.reference
        if rerun.skipped_at != result.run.skipped_at:
            reference = train(setup, cp, 0, device, frozenset(rerun.skipped_at))
        after = parity(rerun, reference, band)
        remedy = Remedy(module, p.worst, after.worst)
    return Diagnosis(
        setup.name, result.recipe.name, step, u, tuple(modules), departure, remedy, first_over_budget(ops), len(ops)
    )


def localise(
    setup: Setup, recipe: Recipe, weights: dict[str, torch.Tensor] | None = None, device: torch.device | str = "cpu"
) -> list[OpPrint]:
    """Every aten op of one AMP step (forward and backward, on the evaluation batch) at ``weights``
    (None: the initial ones), each against float64 on its own inputs
    (:func:`harness.domains.training.ops.record_step`)."""
    dev = torch.device(device)
    model = setup.build(dev)
    if weights is not None:
        model.load_state_dict(weights)
    inputs, targets = setup.eval_batch(dev)

    def step() -> torch.Tensor:
        with torch.autocast(dev.type, dtype=recipe.dtype or torch.bfloat16, enabled=recipe.dtype is not None):
            return setup.loss_on(model, inputs, targets)

    return record_step(model, step, recipe.dtype)
