"""Your own training code as the unit: runs of a user's step function (or of a trainer that runs
its own loop) in fp32 and under each recipe, observed from outside.

What the harness hands the user's code is a :class:`Precision`: an autocast context and a
``torch.amp.GradScaler`` that is enabled only where the recipe scales the loss (a disabled scaler
passes through: ``scale(loss)`` is the loss, ``step(opt)`` steps, ``update()`` does nothing), and
the names trainers use for the same choice (``accelerate``, ``lightning``, ``hf``).

A :class:`Program` runs the user's code for one seed and precision and tells a :class:`Loop` when
each step begins (with the objects it trains: models, optimizers, schedulers, scalers, in any
structure) and ends (with the losses it returned). Everything else is observed without the
user's code knowing: which optimizer stepped (a post hook on each), the scale, parameters and
optimizer state before and after a step, and a non-finite gradient element planted in one
optimizer's parameter (a tensor hook on it, for one step). :class:`StepProgram` is the program
of ``build(seed)`` and ``step(objects, batch, precision)``; the trainers' adapters
(:mod:`harness.domains.training.trainers`) are programs of their own.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from typing import Any, Protocol

import torch
from torch import nn

from harness.domains.engines.state import differences
from harness.domains.engines.training.recipes import Recipe

#: How deep the objects a step trains are searched for models, optimizers and schedulers.
_DEPTH = 4


@dataclass(frozen=True)
class Precision:
    """The precision the harness hands your code for one run.

    Example::

        def step(objects, batch, precision):
            model, opt = objects
            with precision.autocast():
                loss = model(batch).square().mean()
            precision.scaler.scale(loss).backward()
            precision.scaler.step(opt)
            precision.scaler.update()
            opt.zero_grad()
            return loss
    """

    name: str
    #: the autocast dtype (None: fp32, autocast off)
    dtype: torch.dtype | None
    device: torch.device
    #: enabled where the recipe scales the loss; a pass-through otherwise
    scaler: torch.amp.GradScaler

    def autocast(self) -> torch.autocast:
        """``torch.autocast`` in this precision (disabled for fp32)."""
        return torch.autocast(self.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None)

    @property
    def is_fp32(self) -> bool:
        return self.dtype is None

    @property
    def accelerate(self) -> str:
        """Accelerate's ``mixed_precision``: ``no``, ``bf16`` or ``fp16``."""
        return {None: "no", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.dtype]

    @property
    def lightning(self) -> str:
        """Lightning's ``precision``: ``32-true``, ``bf16-mixed`` or ``16-mixed``."""
        return {None: "32-true", torch.bfloat16: "bf16-mixed", torch.float16: "16-mixed"}[self.dtype]

    @property
    def hf(self) -> dict[str, bool]:
        """Hugging Face ``TrainingArguments`` keywords: ``{"bf16": True}``, ``{"fp16": True}`` or none."""
        return {None: {}, torch.bfloat16: {"bf16": True}, torch.float16: {"fp16": True}}[self.dtype]


#: Recipe fields a user's step applies itself (accumulation, clipping, ...): a recipe setting one
#: cannot be handed to code the harness does not run.
_STEP_OWNS = (
    "micro_batches",
    "clip",
    "params_dtype",
    "grad_accum_dtype",
    "loss_factor",
    "static_scale",
    "grad_noise",
    "emulate",
)


def precision_of(recipe: Recipe | None, device: torch.device, init_scale: float | None = None) -> Precision:
    """The :class:`Precision` of ``recipe`` (None: fp32) on ``device``."""
    dtype = None if recipe is None else recipe.dtype
    scaled = recipe is not None and recipe.scaler
    kwargs: dict[str, Any] = {} if init_scale is None else {"init_scale": init_scale}
    scaler = torch.amp.GradScaler(device.type, enabled=scaled, **kwargs)
    return Precision("fp32" if recipe is None else recipe.name, dtype, device, scaler)


def validate_recipes(recipes: object) -> list[Recipe]:
    """The recipes a user's step can be run under: low-precision, without what the step owns."""
    if isinstance(recipes, Recipe | str) or not isinstance(recipes, list | tuple) or not recipes:
        raise TypeError(
            f"recipes must be a non-empty list of Recipe objects (e.g. [BF16, FP16_SCALER]), got {recipes!r}"
        )
    out: list[Recipe] = []
    for r in recipes:
        if not isinstance(r, Recipe):
            raise TypeError(f"not a recipe: {r!r}; pass harness.api.BF16, FP16_SCALER or FP16_NO_SCALER")
        if r.dtype is None:
            raise ValueError(f"recipe {r.name!r} runs in fp32: fp32 is the reference, not a recipe to check")
        owned = [f for f in _STEP_OWNS if getattr(r, f) not in (None, 1, 1.0)]
        if owned or r.control:
            what = ", ".join(owned) if owned else "a negative control"
            raise ValueError(
                f"recipe {r.name!r} sets {what}: your step does its own accumulation, clipping and casts, so the "
                "harness hands it only an autocast dtype and a scaler; pass BF16, FP16_SCALER or FP16_NO_SCALER"
            )
        out.append(r)
    return out


# -- the objects a step trains ------------------------------------------------------------------
def unwrap_optimizer(o: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The torch optimizer under a trainer's wrapper (Accelerate's ``.optimizer``, Lightning's
    ``._optimizer``): the object whose ``step`` runs only when the step is taken."""
    for _ in range(4):
        inner = getattr(o, "optimizer", None) or getattr(o, "_optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is o:
            return o
        o = inner
    return o


@dataclass
class Found:
    """The objects a step trains, by the name they have in its structure."""

    models: dict[str, nn.Module] = field(default_factory=dict)
    optimizers: dict[str, torch.optim.Optimizer] = field(default_factory=dict)
    schedulers: dict[str, Any] = field(default_factory=dict)
    scalers: dict[str, torch.amp.GradScaler] = field(default_factory=dict)

    def stateful(self) -> dict[str, Any]:
        """Every found object, by name: what a resume saves and loads."""
        return {**self.models, **self.optimizers, **self.schedulers, **self.scalers}


def find(objects: object) -> Found:
    """Walk ``objects`` (dicts, lists, tuples, dataclasses, plain objects' attributes) for models,
    optimizers, LR schedulers and GradScalers; each is named by its path (``gen``, ``0``, ``opt_d``)."""
    found, seen = Found(), set()

    def walk(obj: object, path: str, depth: int) -> None:
        if id(obj) in seen or depth > _DEPTH or obj is None:
            return
        seen.add(id(obj))
        name = path or "objects"
        if isinstance(obj, nn.Module):
            found.models.setdefault(name, obj)
        elif isinstance(obj, torch.optim.Optimizer):
            found.optimizers.setdefault(name, unwrap_optimizer(obj))
        elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
            found.schedulers.setdefault(name, obj)
        elif isinstance(obj, torch.amp.GradScaler):
            found.scalers.setdefault(name, obj)
        elif isinstance(obj, Mapping):
            for k, v in obj.items():
                walk(v, f"{path}.{k}" if path else str(k), depth + 1)
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                walk(v, f"{path}.{i}" if path else str(i), depth + 1)
        elif is_dataclass(obj) or (hasattr(obj, "__dict__") and not isinstance(obj, type | torch.Tensor)):
            for k, v in vars(obj).items():
                if not k.startswith("__"):
                    walk(v, f"{path}.{k}" if path else k, depth + 1)

    walk(objects, "", 0)
    # one torch optimizer reached twice (a wrapper and its inner one) counts once
    unique: dict[int, str] = {}
    for n, o in list(found.optimizers.items()):
        if id(o) in unique:
            del found.optimizers[n]
        else:
            unique[id(o)] = n
    return found


def _named(value: object) -> list[tuple[str, object]]:
    """A step's return value as (name, value) pairs, as :func:`losses_of` names them."""
    if isinstance(value, torch.Tensor | float | int) and not isinstance(value, bool):
        return [("loss", value)]
    if isinstance(value, Mapping):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [(f"loss{i}", v) for i, v in enumerate(value)]
    if value is not None and hasattr(value, "loss"):
        return [("loss", value.loss)]
    return []


def loss_dtypes_of(value: object) -> dict[str, torch.dtype]:
    """The dtype of each loss a step returned as a tensor (a number has none to judge)."""
    return {k: v.dtype for k, v in _named(value) if isinstance(v, torch.Tensor) and v.numel() == 1}


def losses_of(value: object, step: int) -> dict[str, float]:
    """A step's return value as named losses: a tensor or number is ``loss``; a dict its items; a
    tuple or list ``loss0``, ``loss1``, ... (a trainer's output's ``loss`` is read too)."""
    items = _named(value)
    out: dict[str, float] = {}
    for k, v in items:
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            out[k] = float(v.detach().float())
        elif isinstance(v, float | int) and not isinstance(v, bool):
            out[k] = float(v)
    if not out:
        raise TypeError(
            f"step {step} returned {type(value).__name__} ({value!r:.80}): a step must return its loss (a scalar "
            "tensor or number), or several as a dict or tuple of them; the harness judges what it returns"
        )
    return out


# -- one run, observed ------------------------------------------------------------------------
@dataclass(frozen=True)
class Plant:
    """A non-finite gradient element planted in one optimizer's gradients at step ``step``."""

    optimizer: str
    step: int
    value: float = math.inf


def _snapshot(found: Found) -> dict[str, Any]:
    """Bitwise copies of every optimizer's parameters and state."""
    out: dict[str, Any] = {}
    for n, o in found.optimizers.items():
        params = [p.detach().clone() for g in o.param_groups for p in g["params"]]
        state = [
            {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()}
            for s in o.state.values()
        ]
        out[n] = (params, state)
    return out


def _changed(before: Any, after: Any) -> bool:
    """Whether a step changed an optimizer's parameters or state: the skipped-step rule's
    :func:`~harness.domains.engines.state.differences` (bitwise, NaN equal to NaN)."""
    (p0, s0), (p1, s1) = before, after
    return bool(differences(p0, p1, dict(enumerate(s0)), dict(enumerate(s1))))


def _finite(found: Found, name: str) -> bool:
    o = found.optimizers[name]
    return all(bool(torch.isfinite(p).all()) for g in o.param_groups for p in g["params"])


@dataclass
class Observed:
    """What a planted step did to each optimizer (parameters and state changed?, still finite?)."""

    changed: dict[str, bool]
    finite: dict[str, bool]
    scale_before: float | None
    scale_after: float | None
    #: whether a GradScaler unscaled the optimizer's gradients (and so received the planted value)
    reached: bool = True
    #: optimizer -> whether its parameters were finite when the planted step began
    finite_before: dict[str, bool] = field(default_factory=dict)


def _caller() -> str:
    """``module.function`` of the first frame outside torch and this module: who called the scaler."""
    frame = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if not (module == __name__ or module.startswith("torch.")):
            owner = frame.f_locals.get("self")
            where = f"{type(owner).__name__}.{frame.f_code.co_name}" if owner is not None else frame.f_code.co_name
            return f"{module}.{where}"
        frame = frame.f_back  # type: ignore[assignment]
    return ""


@dataclass(frozen=True)
class ScalerCall:
    """One call the code made on a GradScaler in a step: ``scale``, ``unscale_`` (its own, not the
    one ``step`` makes), ``step`` or ``update``; the optimizer's name; for ``update``, whether any
    optimizer stepped since the last update found a non-finite gradient, the scale before and
    after, the scaler's growth rule, and whether the code set the scale itself."""

    kind: str
    optimizer: str = ""
    found_inf: bool = False
    scale_before: float = math.nan
    scale_after: float = math.nan
    growth: tuple[float, float, int] = (2.0, 0.5, 2000)
    explicit: bool = False
    #: who made the call (``module.Class.function`` of the first frame outside torch): the user's
    #: code, or a trainer's plugin, which the verdict names
    caller: str = ""


@dataclass
class Trace:
    """One run of the user's code: its losses per step, which optimizer stepped when, the scale."""

    seed: int
    precision: str
    losses: list[dict[str, float]] = field(default_factory=list)
    #: optimizer name -> the steps at which its ``step`` ran
    stepped: dict[str, list[int]] = field(default_factory=dict)
    scales: list[float] = field(default_factory=list)
    #: model name -> its parameters at the end, flattened
    final: dict[str, torch.Tensor] = field(default_factory=dict)
    planted: Observed | None = None
    names: list[str] = field(default_factory=list)
    #: what the walk found in the objects (models and optimizers, by name)
    found: list[str] = field(default_factory=list)
    #: parameter (``model.path``) -> its dtype at the end: fp32 master weights stay fp32 under autocast
    param_dtypes: dict[str, torch.dtype] = field(default_factory=dict)
    #: step -> the GradScaler calls the code made in it, in order
    scaler_calls: dict[int, list[ScalerCall]] = field(default_factory=dict)
    #: loss name -> the dtypes it was returned in (as a tensor), over the run
    loss_dtypes: dict[str, set[torch.dtype]] = field(default_factory=dict)
    #: loss name -> (the loss as computed, the same loss recomputed from float64 inputs) where the
    #: harness sees its inputs (a trainer's ``compute_loss_func``): the size of a low-precision loss's error
    loss_float64: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: the parameters (``model.path``) some optimizer of the code trains (a frozen teacher's are not)
    trained: set[str] = field(default_factory=set)

    def skipped(self, optimizer: str) -> list[int]:
        took = set(self.stepped.get(optimizer, []))
        return [k for k in range(len(self.losses)) if k not in took]

    def curve(self, loss: str) -> list[float]:
        return [step.get(loss, math.nan) for step in self.losses]


class Loop:
    """The harness's side of a run: the user's code (through its :class:`Program`) calls
    :meth:`begin` at the start of each step with the objects it trains, and :meth:`end` with what
    the step returned."""

    def __init__(
        self,
        precision: Precision,
        seed: int,
        plant: Plant | None = None,
        undo: Mapping[int, Sequence[str]] | None = None,
        observe: Callable[[int, Found], contextlib.AbstractContextManager[object]] | None = None,
    ) -> None:
        self.precision, self.plant = precision, plant
        #: step -> optimizers whose step is undone after it (the fp32 reference replays the AMP run's skips)
        self.undo = dict(undo or {})
        self.trace = Trace(seed, precision.name)
        self.found = Found()
        self.step = -1
        self._hooked: set[int] = set()
        self._before: dict[str, Any] | None = None
        self._handles: list[Any] = []
        self._observe = observe
        self._observing: contextlib.ExitStack | None = None
        self._scale_before: float | None = None
        self._finite_before: dict[str, bool] = {}
        self._planted = False
        self._unpatch: Callable[[], None] | None = None
        self._unrecord: Callable[[], None] | None = None

    @property
    def steps_done(self) -> int:
        return len(self.trace.losses)

    def _hook(self, found: Found) -> None:
        for name, o in found.optimizers.items():
            if id(o) in self._hooked:
                continue
            self._hooked.add(id(o))
            self.trace.stepped.setdefault(name, [])

            def post(opt: Any, args: Any, kwargs: Any, _name: str = name) -> None:
                self.trace.stepped[_name].append(self.step)

            self._handles.append(o.register_step_post_hook(post))

    def begin(self, objects: object) -> None:
        """Step ``k`` begins (k counts the calls): ``objects`` are what it trains."""
        self.step = self.steps_done
        self.found = find(objects)
        self._hook(self.found)
        k = self.step
        if (self.plant is not None and k == self.plant.step) or k in self.undo:
            self._before = _snapshot(self.found)
            self._finite_before = {n: _finite(self.found, n) for n in self.found.optimizers}
            self._scale_before = self._scale()
        self._record_scaler_calls(k)
        if self.plant is not None and k == self.plant.step:
            self._plant(self.plant)
        if self._observe is not None:
            self._observing = contextlib.ExitStack()
            self._observing.enter_context(self._observe(k, self.found))

    def _name_of(self, optimizer: torch.optim.Optimizer) -> str:
        inner = unwrap_optimizer(optimizer)
        return next((n for n, o in self.found.optimizers.items() if o is inner), type(optimizer).__name__)

    def _record_scaler_calls(self, k: int) -> None:
        """Record step ``k``'s calls on any GradScaler (the harness's, the code's, a trainer's) in
        ``trace.scaler_calls``, through the class's methods, while the step runs."""
        calls = self.trace.scaler_calls.setdefault(k, [])
        cls = torch.amp.GradScaler
        originals = (cls.unscale_, cls.step, cls.update, cls.scale)
        loop, inside = self, [0]

        def scale(scaler: torch.amp.GradScaler, outputs: Any) -> Any:
            if not inside[0] and scaler.is_enabled():
                calls.append(ScalerCall("scale", caller=_caller()))
            return originals[3](scaler, outputs)

        def unscale_(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
            if not inside[0] and scaler.is_enabled():
                calls.append(ScalerCall("unscale_", loop._name_of(optimizer)))
            originals[0](scaler, optimizer)

        def step(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            if scaler.is_enabled():
                calls.append(ScalerCall("step", loop._name_of(optimizer)))
            inside[0] += 1
            try:
                return originals[1](scaler, optimizer, *args, **kwargs)
            finally:
                inside[0] -= 1

        def update(scaler: torch.amp.GradScaler, new_scale: Any = None) -> None:
            if not scaler.is_enabled():
                originals[2](scaler, new_scale)
                return
            states = getattr(scaler, "_per_optimizer_states", {}).values()
            found = any(float(v) > 0 for st in states for v in st.get("found_inf_per_device", {}).values())
            before = float(scaler.get_scale()) if getattr(scaler, "_scale", None) is not None else math.nan
            originals[2](scaler, new_scale)
            rule = (scaler.get_growth_factor(), scaler.get_backoff_factor(), scaler.get_growth_interval())
            calls.append(
                ScalerCall(
                    "update", "", found, before, float(scaler.get_scale()), rule, new_scale is not None, _caller()
                )
            )

        cls.unscale_, cls.step, cls.update, cls.scale = unscale_, step, update, scale  # type: ignore[method-assign,assignment]

        def restore() -> None:
            cls.unscale_, cls.step, cls.update, cls.scale = originals  # type: ignore[method-assign]

        self._unrecord = restore

    def _scale(self) -> float | None:
        """The scale of the GradScaler the code uses: one among its objects, else the harness's
        (a scaler whose ``scale`` was never called has no scale yet, and is not the one)."""
        for s in [*self.found.scalers.values(), self.precision.scaler]:
            if s.is_enabled() and getattr(s, "_scale", None) is not None:
                return float(s.get_scale())
        return None

    def _plant(self, plant: Plant) -> None:
        """Plant ``plant.value`` in the first gradient element of the optimizer's first parameter that
        has one, at the moment a GradScaler unscales that optimizer's gradients (any GradScaler: the
        harness's, the user's, a trainer's): what the optimizer is about to consume."""
        target = self.found.optimizers.get(plant.optimizer)
        if target is None:
            raise ValueError(f"no optimizer {plant.optimizer!r} among {sorted(self.found.optimizers)}")
        original = torch.amp.GradScaler.unscale_
        loop = self

        def unscale_(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> None:
            if unwrap_optimizer(optimizer) is target and not loop._planted:
                grad = next((p.grad for g in target.param_groups for p in g["params"] if p.grad is not None), None)
                if grad is not None:
                    grad.view(-1)[0] = plant.value
                    loop._planted = True
            original(scaler, optimizer)

        self._planted = False
        torch.amp.GradScaler.unscale_ = unscale_  # type: ignore[method-assign,assignment]
        self._unpatch = lambda: setattr(torch.amp.GradScaler, "unscale_", original)

    def end(
        self,
        returned: object,
        dtypes: Mapping[str, torch.dtype] | None = None,
        float64: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    ) -> None:
        """Step ``k`` ended, returning ``returned`` (its losses); ``dtypes``: the dtype each loss was
        computed in, where ``returned`` no longer says (a trainer's losses summed as numbers);
        ``float64``: per loss, (as computed, recomputed from float64 inputs) where the caller could."""
        k = self.step
        for loss, pairs in (float64 or {}).items():
            self.trace.loss_float64.setdefault(loss, []).extend(pairs)
        if self._observing is not None:
            self._observing.close()
            self._observing = None
        self.trace.losses.append(losses_of(returned, k))
        for loss, dtype in (loss_dtypes_of(returned) if dtypes is None else dtypes).items():
            self.trace.loss_dtypes.setdefault(loss, set()).add(dtype)
        scale = self._scale()
        if scale is not None:
            self.trace.scales.append(scale)
        if self._before is not None and k in self.undo:
            self._restore(self._before, self.undo[k])
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        if self._unrecord is not None:
            self._unrecord()
            self._unrecord = None
        if self.plant is not None and k == self.plant.step and self._before is not None:
            after = _snapshot(self.found)
            self.trace.planted = Observed(
                {n: _changed(self._before[n], after[n]) for n in after},
                {n: _finite(self.found, n) for n in after},
                self._scale_before,
                scale,
                self._planted,
                dict(self._finite_before),
            )
        self._before = None

    def _restore(self, before: dict[str, Any], names: Sequence[str]) -> None:
        for n in names:
            o = self.found.optimizers.get(n)
            if o is None:
                continue
            params, states = before[n]
            with torch.no_grad():
                for p, saved in zip((p for g in o.param_groups for p in g["params"]), params, strict=True):
                    p.copy_(saved)
            for s, saved_state in zip(o.state.values(), states, strict=False):
                for key, v in saved_state.items():
                    if isinstance(v, torch.Tensor) and isinstance(s.get(key), torch.Tensor):
                        s[key].copy_(v)
                    else:
                        s[key] = v

    def finish(self) -> Trace:
        """Take the hooks, the planting patch and an observation in progress off; the trace."""
        if self._observing is not None:
            self._observing.close()
            self._observing = None
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        if self._unrecord is not None:
            self._unrecord()
            self._unrecord = None
        for h in self._handles:
            h.remove()
        self._handles = []
        for name, m in self.found.models.items():
            self.trace.final[name] = torch.cat(
                [p.detach().float().flatten() for p in m.parameters()] or [torch.zeros(0)]
            )
            optimized = {id(q) for o in self.found.optimizers.values() for g in o.param_groups for q in g["params"]}
            for pname, p in m.named_parameters():
                self.trace.param_dtypes[f"{name}.{pname}"] = p.dtype
                if id(p) in optimized:
                    self.trace.trained.add(f"{name}.{pname}")
        self.trace.names = sorted({n for s in self.trace.losses for n in s})
        self.trace.found = [*self.found.models, *self.found.optimizers]
        return self.trace


class Program(Protocol):
    """The user's training code for the harness: one run for a seed under a precision."""

    #: the name rows are recorded under
    name: str

    def run(self, seed: int, precision: Precision, loop: Loop) -> None:
        """Train as the user's code does, calling ``loop.begin(objects)`` and ``loop.end(losses)``
        around each step."""

    @property
    def resumable(self) -> str | None:
        """None where the program can save and resume (a step program through the objects' state
        dicts, a trainer's through its own checkpoints: ``run_resumed``); else why not."""


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty for p in params)


@dataclass
class StepProgram:
    """``build(seed)`` (or ``build(seed, precision)``) -> the objects; ``step(objects, batch,
    precision)`` -> the losses; ``batches``: a sequence, or ``batches(seed)`` -> a sequence."""

    name: str
    build: Callable[..., Any]
    step: Callable[[Any, Any, Precision], Any]
    batches: Sequence[Any] | Callable[[int], Sequence[Any]]
    #: how many of the batches to train on (None: all); every run of seed s calls
    #: ``torch.manual_seed(s)`` before ``build``
    steps: int | None = None

    def data(self, seed: int) -> list[Any]:
        data = list(self.batches(seed) if callable(self.batches) else self.batches)
        if self.steps is not None:
            if len(data) < self.steps:
                raise ValueError(f"{self.name}: {len(data)} batches for {self.steps} steps")
            data = data[: self.steps]
        return data

    def objects(self, seed: int, precision: Precision) -> Any:
        torch.manual_seed(seed)
        return self.build(seed, precision) if _arity(self.build) >= 2 else self.build(seed)

    def run(self, seed: int, precision: Precision, loop: Loop) -> None:
        objects = self.objects(seed, precision)
        for batch in self.data(seed):
            loop.begin(objects)
            loop.end(self.step(objects, batch, precision))

    @property
    def resumable(self) -> str | None:
        return None


class CodeRaised(Exception):
    """The user's code raised during a run: which precision, at which step (the steps begun), and
    the exception itself (``__cause__``). A result for the recipe, not an error of the harness."""

    def __init__(self, precision: str, step: int, error: BaseException) -> None:
        self.precision, self.step, self.error = precision, step, error
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        super().__init__(f"the code raised at step {step} under {precision}: {type(error).__name__}: {first}")


def trace(program: Program, seed: int, precision: Precision, **loop: Any) -> Trace:
    """One observed run of ``program``; :class:`CodeRaised` when the code raises (a step that
    raises under one recipe is that recipe's result)."""
    observed = Loop(precision, seed, **loop)
    try:
        program.run(seed, precision, observed)
    except Exception as error:  # the user's code: any exception is what it did
        raise CodeRaised(precision.name, max(observed.step, 0), error) from error
    finally:
        # hooks and the planting patch come off even when the user's code raises
        trace_of_run = observed.finish()
    return trace_of_run


def trace_resumed(program: Any, seed: int, precision: Precision, at: int) -> Trace:
    """One run of a program that saves and resumes through its trainer's own checkpoints
    (``program.run_resumed``), observed as one run: steps before ``at`` from the first trainer,
    the rest from the one resumed from its checkpoint."""
    observed = Loop(precision, seed)
    try:
        program.run_resumed(seed, precision, observed, at)
    except Exception as error:  # the user's code or its trainer: what it did
        raise CodeRaised(precision.name, max(observed.step, 0), error) from error
    finally:
        trace_of_run = observed.finish()
    return trace_of_run


# -- resume -----------------------------------------------------------------------------------
def resumed(program: StepProgram, seed: int, make: Callable[[], Precision], at: int) -> Trace:
    """Run ``at`` steps, save every found object's state dict (and the harness's scaler, torch's RNG)
    with ``torch.save``, load it into fresh objects from ``build`` and run on."""
    precision = make()
    first = Loop(precision, seed)
    data = program.data(seed)
    objects = program.objects(seed, precision)
    for batch in data[:at]:
        first.begin(objects)
        first.end(program.step(objects, batch, precision))
    first.finish()
    found = find(objects)
    buffer = io.BytesIO()
    torch.save(
        {
            "objects": {n: o.state_dict() for n, o in found.stateful().items()},
            "scaler": precision.scaler.state_dict(),
            "rng": torch.get_rng_state(),
        },
        buffer,
    )
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    fresh_precision = make()
    fresh = program.objects(seed, fresh_precision)
    fresh_found = find(fresh)
    for n, o in fresh_found.stateful().items():
        if n in saved["objects"]:
            o.load_state_dict(saved["objects"][n])
    if saved["scaler"]:
        fresh_precision.scaler.load_state_dict(saved["scaler"])
    torch.set_rng_state(saved["rng"])
    second = Loop(fresh_precision, seed)
    second.trace.losses = list(first.trace.losses)
    second.trace.scales = list(first.trace.scales)
    for batch in data[at:]:
        second.begin(fresh)
        second.end(program.step(fresh, batch, fresh_precision))
    return second.finish()
