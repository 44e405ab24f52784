"""Activation checkpointing in a user's own model: every module whose forward runs again during the
backward (a checkpointed block, however the model checkpoints it: ``torch.utils.checkpoint``
reentrant or not, Hugging Face's ``gradient_checkpointing_enable()``, a wrapper of its own) must
recompute in the dtypes of its original forward. A recompute in another precision gives gradients
of another computation than the loss's (reentrant), or raises ``CheckpointError`` in the backward
(non-reentrant): either way the module is named.

Observed with forward hooks on every module during one forward and backward of the setup's
evaluation batch under the recipe's autocast: the forward's calls, then the calls the backward
makes. The reference is the module's own original forward, never the checkpointing code."""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from harness.domains.engines.training.recipes import Recipe, Setup, tree_map
from harness.platform.compat import force_eager


def _dtypes(output: Any) -> tuple[str, ...]:
    """The floating dtypes of a module's output tensors, in order."""
    seen: list[str] = []

    def note(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            seen.append(str(t.dtype).removeprefix("torch."))
        return t

    tree_map(note, output)
    return tuple(seen)


@dataclass
class Recomputation:
    """Per module: the output dtypes of its calls in the forward, and of its calls in the backward."""

    forward: dict[str, list[tuple[str, ...]]] = field(default_factory=lambda: defaultdict(list))
    backward: dict[str, list[tuple[str, ...]]] = field(default_factory=lambda: defaultdict(list))
    #: what the backward raised (a non-reentrant checkpoint's CheckpointError, or a recompute that
    #: cannot run in the dtypes it was given), or None
    raised: str | None = None
    #: the modules being recomputed when the backward raised, outermost first
    raised_in: list[str] = field(default_factory=list)
    #: the modules compiled with ``torch.compile`` ("" for the model itself), observed eager
    compiled: list[str] = field(default_factory=list)

    @property
    def recomputed(self) -> list[str]:
        """The modules whose forward ran again in the backward, outermost first."""
        return [m for m in self.backward if m in self.forward]

    def mismatched_modules(self) -> list[str]:
        """The recomputed modules whose recompute gave dtypes their forward never gave."""
        return [n for n in self.recomputed if not set(self.backward[n]) <= set(self.forward[n])]

    def mismatches(self) -> list[str]:
        """Each recomputed module a recompute of which gave output dtypes none of its forward's calls
        gave, in words (a recompute may stop early or cover fewer calls: only what it computed counts)."""
        out = []
        for name in self.recomputed:
            first, again = self.forward[name], self.backward[name]
            if not set(again) <= set(first):
                out.append(f"{name or '(the model)'}: forward {_show(first)}, recomputed {_show(again)}")
        return out


def blocks_of(names: list[str], recomputed: list[str]) -> list[str]:
    """The outermost recomputed module holding each of ``names`` (the checkpointed block, where its
    own forward completed again), in order, each once."""
    out: list[str] = []
    for name in names:
        holders = [r for r in recomputed if r and (name == r or name.startswith(r + "."))]
        block = min(holders, key=len) if holders else name
        if block not in out:
            out.append(block)
    return out


def _show(calls: list[tuple[str, ...]]) -> str:
    return ", ".join("/".join(c) or "no float output" for c in sorted(set(calls)))


def _uncompiled(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """``model`` with every module ``torch.compile`` wrapped replaced by the module it compiled, and
    the names of those replaced. Inside a compiled graph a module hook runs only while Dynamo traces
    (and tracing the observer's hooks can fail in Dynamo itself): the compiled backward's recompute is
    out of their sight, so a compiled model's recompute is observed on its eager modules."""
    optimized = getattr(sys.modules.get("torch._dynamo.eval_frame"), "OptimizedModule", None)
    if optimized is None:  # Dynamo never imported: nothing was compiled
        return model, []
    compiled: list[str] = []
    if isinstance(model, optimized):
        model, compiled = model._orig_mod, [""]
    stack = [("", model)]
    while stack:
        prefix, parent = stack.pop()
        for name, child in list(parent.named_children()):
            if isinstance(child, optimized):
                child = child._orig_mod
                setattr(parent, name, child)
                compiled.append(prefix + name)
            stack.append((f"{prefix}{name}.", child))
    return model, compiled


def _eager() -> contextlib.AbstractContextManager[object]:
    """Every ``torch.compile`` directive ignored (a function compiled inside the model's forward too),
    where Dynamo has been imported at all."""
    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    return force_eager()  # set until exited


def observe(setup: Setup, recipe: Recipe, device: torch.device) -> Recomputation:
    """One forward and backward of ``setup``'s model (its initial weights, training mode) on its
    evaluation batch under ``recipe``'s autocast, with every module's calls recorded. A compiled
    model runs eager here (:func:`_uncompiled`): the recompute observed is its modules'."""
    model, compiled = _uncompiled(setup.build(device))
    inputs, targets = setup.eval_batch(device)
    seen = Recomputation(compiled=compiled)
    phase = [seen.forward]
    names = {m: n for n, m in model.named_modules()}

    entered: list[str] = []

    def enter(module: nn.Module, _args: Any) -> None:
        entered.append(names[module])

    def hook(module: nn.Module, _args: Any, output: Any) -> None:
        if entered and entered[-1] == names[module]:
            entered.pop()
        phase[0][names[module]].append(_dtypes(output))

    handles = [m.register_forward_pre_hook(enter) for m in names]
    handles += [m.register_forward_hook(hook) for m in names]
    try:
        with _eager():
            with torch.autocast(device.type, dtype=recipe.dtype or torch.bfloat16, enabled=recipe.dtype is not None):
                loss = setup.loss_on(model, inputs, targets)
            phase[0] = seen.backward
            entered.clear()
            try:
                loss.backward()  # type: ignore[no-untyped-call]
            except RuntimeError as exc:  # torch.utils.checkpoint.CheckpointError is one
                seen.raised = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                seen.raised_in = list(entered)
    finally:
        for h in handles:
            h.remove()
    return seen
