"""The AMP lane per module: each module's own error in one AMP step, against what that module
owes, so that a region a whole-step ratio is too coarse to see is judged on its own.

During one AMP forward every leaf module call (and every call of a custom autograd function that
declares a dtype with ``torch.amp.custom_fwd(cast_inputs=...)``) is recorded with the inputs it
received in that run and the output it gave. Afterwards each is run again alone on those inputs:

* exact: in float64, outside autocast (the reference every error is measured against);
* in fp32, outside autocast (the error float32 arithmetic owes);
* for a region under autocast, correctly rounded: in float64 with autocast's low-precision
  functions rounded (:class:`~harness.domains.engines.training.emulation.RoundingMode`), the output
  rounded to the dtype the AMP run gave.

A module called with autocast off inside the AMP step (a frozen bf16 teacher, a loss computed in
fp32, an ``autocast(enabled=False)`` block) runs as the code says and is left out: name it in
``fp32_modules`` to hold it to fp32.

Its own error in the AMP run, relative (Frobenius) to the exact output, may be at most
:data:`LANE_FACTOR` times what it owes: for a region under autocast the larger of the correctly
rounded and the fp32 error; for a **declared-fp32 region** the fp32 error, never the autocast
dtype's. Declared are: custom functions with ``cast_inputs=torch.float32`` (read from the
decorated forward, so a torch that drops the cast is still held to it) and modules the caller
names in ``fp32_modules``. Every error is
floored at fp32's unit roundoff: below it two float32 results differ by their last bit.

A model compiled with ``torch.compile`` is observed eager (``set_stance("force_eager")``): its
compiled kernels are the compiled suite's to judge.

What it does not judge: which dtype an op should run in under autocast (the autocast policy
table's claim, :mod:`harness.domains.autocast`): a module whose output dtype changed is judged
against a correct rounding to the dtype it gave. Dropout modules are left out (their own op is a
random mask), and every rerun restores the RNG state the call saw.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.domains.engines.training.amp_lane import LANE_FACTOR, relative_error
from harness.domains.engines.training.emulation import RoundingMode
from harness.domains.engines.training.recipes import Setup, tensors, tree_map
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP32 as FP32_FORMAT
from harness.platform.compat import force_eager

#: Below this relative error two results are float32 resolution apart (fp32's unit roundoff): an
#: owed error smaller than it is raised to it, so an exact region is not judged on rounding noise.
FLOOR = FP32_FORMAT.unit_roundoff
#: Modules whose own op is a random mask: nothing autocast does to them is numerics.
RANDOM_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class RegionError:
    """One region call of the AMP step: its own error and what it owes, relative to float64."""

    #: the module's name (``model.block.0.attn``), a custom function's ``module:Function``
    name: str
    kind: str
    #: "autocast" or why it is declared fp32 (``cast_inputs``, ``autocast disabled``, ``named``)
    declared: str
    amp: float
    #: the correctly rounded region's error (None for a declared-fp32 region)
    rounded: float | None
    fp32: float
    output_dtype: str

    @property
    def owed(self) -> float:
        """The error this region may have: the larger of what it owes and fp32's resolution."""
        owed = self.fp32 if self.rounded is None else max(self.rounded, self.fp32)
        return max(owed, FLOOR)

    @property
    def ratio(self) -> float:
        return self.amp / self.owed if math.isfinite(self.amp) else math.inf

    @property
    def passed(self) -> bool:
        return self.ratio <= LANE_FACTOR


def relative(a: torch.Tensor, exact: torch.Tensor) -> float:
    """||a - exact|| / ||exact|| in float64 (inf for a shape mismatch or a non-finite value)."""
    a64, b64 = a.detach().double(), exact.detach().double()
    return math.inf if a64.shape != b64.shape else relative_error(a64, b64)


def declared_dtype(function: type) -> torch.dtype | None:
    """The dtype a custom autograd function declares for its forward (``custom_fwd``'s
    ``cast_inputs``, read from the decorated forward), or None."""
    fwd = getattr(function, "forward", None)
    for _ in range(8):  # decorators wrapping decorators
        if fwd is None:
            return None
        code, cells = getattr(fwd, "__code__", None), getattr(fwd, "__closure__", None)
        if code is not None and cells:
            for name, cell in zip(code.co_freevars, cells, strict=False):
                if name == "cast_inputs":
                    with contextlib.suppress(ValueError):
                        value = cell.cell_contents
                        return value if isinstance(value, torch.dtype) else None
        fwd = getattr(fwd, "__wrapped__", None)
    return None


def _first_floating(output: Any) -> torch.Tensor | None:
    return next((t for t in tensors(output) if t.is_floating_point()), None)


def _cast(obj: Any, dtype: torch.dtype | None) -> Any:
    """Floating tensors of ``obj`` detached, in ``dtype`` (None: kept in theirs)."""
    return tree_map(lambda t: (t.to(dtype) if dtype is not None and t.is_floating_point() else t).detach(), obj)


@dataclass
class _Call:
    name: str
    kind: str
    declared: str
    rerun: Rerun
    args: Any
    kwargs: Any
    output: torch.Tensor
    rng: torch.Tensor


def _unhooked(module: nn.Module) -> nn.Module:
    """A copy of ``module`` without the forward hooks (the observer's among them) it carries."""
    copied = copy.deepcopy(module)
    for m in copied.modules():
        m._forward_hooks.clear()
        m._forward_pre_hooks.clear()
        m._forward_hooks_with_kwargs.clear()
        m._forward_pre_hooks_with_kwargs.clear()
    return copied


#: runs a recorded region again: (args, kwargs, the dtype of its parameters, the low-precision
#: dtype its autocast functions round to or None) -> its output
Rerun = Callable[[Any, Any, torch.dtype, torch.dtype | None], Any]


def _module_rerun(module: nn.Module) -> Rerun:
    frozen = _unhooked(module)

    def rerun(args: Any, kwargs: Any, dtype: torch.dtype, round_to: torch.dtype | None) -> Any:
        m = copy.deepcopy(frozen).to(dtype)
        with RoundingMode(round_to) if round_to is not None else contextlib.nullcontext():
            return m(*args, **kwargs)

    return rerun


def _function_rerun(function: Any) -> Rerun:
    def rerun(args: Any, kwargs: Any, dtype: torch.dtype, round_to: torch.dtype | None) -> Any:
        return function.apply(*args, **kwargs)  # no parameters of its own: its inputs carry the dtype

    return rerun


class Observer:
    """Records the region calls of one AMP forward. Use as a context manager around the step::

    with Observer(models, "cpu", fp32_modules=("head",)) as seen:
        step()
    errors = seen.errors(torch.bfloat16)
    """

    def __init__(self, models: Mapping[str, nn.Module], device_type: str, fp32_modules: Sequence[str] = ()) -> None:
        self.models, self.device_type, self.fp32_modules = dict(models), device_type, tuple(fp32_modules)
        self.calls: list[_Call] = []
        self._stack: list[str] = []
        self._handles: list[Any] = []
        self._apply: Any = None
        #: (name, module, args, kwargs, rng state, autocast enabled) of the calls under way
        self._pending: list[tuple[str, nn.Module, Any, Any, torch.Tensor, bool]] = []
        #: the autocast dtypes module calls ran under (empty: no module ran under autocast)
        self.autocast_dtypes: set[torch.dtype] = set()

    def _named(self) -> Iterator[tuple[str, nn.Module]]:
        single = len(self.models) == 1
        for model_name, model in self.models.items():
            for name, module in model.named_modules():
                # one model: its modules by their own names, the model itself by the model's name
                yield (name if single else f"{model_name}.{name}") if name else model_name, module

    def __enter__(self) -> Observer:
        marked = set(self.fp32_modules)
        for name, module in self._named():
            leaf = not any(True for _ in module.children())
            judged = (leaf or name in marked) and not isinstance(module, RANDOM_MODULES)
            self._handles.append(module.register_forward_pre_hook(self._pre(name, module, judged), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._post(name, judged), with_kwargs=True))
        unknown = marked - {n for n, _ in self._named()}
        if unknown:
            self.__exit__(None, None, None)
            raise ValueError(
                f"fp32_modules names no module: {sorted(unknown)}; names are those of model.named_modules()"
                + (" prefixed by the model's name" if len(self.models) > 1 else "")
            )
        # a classmethod in Python (torch 2.13) or a C classmethod_descriptor (2.15): both bind by __get__
        self._apply = torch.autograd.Function.__dict__["apply"]
        observer = self

        def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
            declared = declared_dtype(cls)
            if declared is None or not torch.is_autocast_enabled(observer.device_type):
                return observer._apply.__get__(None, cls)(*args, **kwargs)
            arrived = (_cast(args, None), _cast(kwargs, None), torch.get_rng_state())
            out = observer._apply.__get__(None, cls)(*args, **kwargs)
            first = _first_floating(out)
            if first is not None:
                where = observer._stack[-1] if observer._stack else "(model)"
                observer.calls.append(
                    _Call(
                        f"{where}:{cls.__name__}",
                        cls.__name__,
                        f"cast_inputs={declared}",
                        _function_rerun(cls),
                        arrived[0],
                        arrived[1],
                        first.detach().clone(),
                        arrived[2],
                    )
                )
            return out

        torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._apply is not None:
            torch.autograd.Function.apply = self._apply  # type: ignore[method-assign]
            self._apply = None

    def _pre(self, name: str, module: nn.Module, judged: bool) -> Callable[..., None]:
        def pre(mod: nn.Module, args: Any, kwargs: Any) -> None:
            self._stack.append(name)
            if judged:
                enabled = torch.is_autocast_enabled(self.device_type)
                if enabled:
                    self.autocast_dtypes.add(torch.get_autocast_dtype(self.device_type))
                self._pending.append(
                    (name, mod, _cast(args, None), _cast(kwargs, None), torch.get_rng_state(), enabled)
                )

        return pre

    def _post(self, name: str, judged: bool) -> Callable[..., None]:
        def post(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if self._stack:
                self._stack.pop()
            if not judged:
                return
            _, module, a, k, rng, enabled = self._pending.pop()
            out = _first_floating(output)
            if out is None:
                return
            if name in self.fp32_modules:
                declared = "named fp32"
            elif not enabled:
                # outside autocast it runs as the code says (a frozen bf16 teacher, a loss in fp32):
                # nothing to hold it to but itself; name it in fp32_modules to hold it to fp32
                return
            else:
                declared = "autocast"
            self.calls.append(
                _Call(
                    name,
                    type(module).__name__,
                    declared,
                    _module_rerun(module),
                    a,
                    k,
                    out.detach().clone(),
                    rng,
                )
            )

        return post

    def errors(self, dtype: torch.dtype) -> list[RegionError]:
        """Each recorded call run again alone (exact, fp32, correctly rounded to ``dtype``): its errors."""
        return [_measure(c, self.device_type, dtype) for c in self.calls]


def _measure(c: _Call, device_type: str, low: torch.dtype) -> RegionError:
    def run(dtype: torch.dtype, round_to: torch.dtype | None = None) -> torch.Tensor | None:
        torch.set_rng_state(c.rng)  # what the call drew (a dropout inside it), it draws again
        with torch.no_grad(), torch.autocast(device_type, enabled=False):
            out = c.rerun(_cast(c.args, dtype), _cast(c.kwargs, dtype), dtype, round_to)
        return _first_floating(out)

    saved = torch.get_rng_state()
    try:
        exact = run(torch.float64)
        in_fp32 = run(torch.float32)
        rounded = run(torch.float64, low) if c.declared == "autocast" else None
    finally:
        torch.set_rng_state(saved)
    if exact is None or in_fp32 is None:
        return RegionError(c.name, c.kind, c.declared, math.inf, None, math.inf, str(c.output.dtype))
    rounded_error = None
    if rounded is not None:
        rounded_error = relative(rounded.to(c.output.dtype), exact)
    return RegionError(
        c.name,
        c.kind,
        c.declared,
        relative(c.output, exact),
        rounded_error,
        relative(in_fp32, exact),
        str(c.output.dtype),
    )


def observe(
    models: Mapping[str, nn.Module],
    step: Callable[[], object],
    device_type: str,
    dtype: torch.dtype,
    fp32_modules: Sequence[str] = (),
) -> list[RegionError]:
    """Run ``step`` (one AMP step of ``models``) under an :class:`Observer`; every region's errors."""
    observer = Observer(models, device_type, fp32_modules)
    # a compiled model runs eager while observed: hooks and copies are not what dynamo traces
    with observer, force_eager():
        step()
    return observer.errors(dtype)


def of_setup(
    setup: Setup, dtype: torch.dtype, device: torch.device, fp32_modules: Sequence[str] = ()
) -> list[RegionError]:
    """The regions of one AMP step of ``setup`` (initial weights, evaluation batch) under ``dtype``."""
    model = setup.build(device)
    inputs, targets = setup.eval_batch(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype):
            loss = setup.loss_on(model, inputs, targets)
        loss.float().backward()  # type: ignore[no-untyped-call]

    return observe({setup.name: model}, step, device.type, dtype, fp32_modules)


def tags(errors: Sequence[RegionError], top: int = 20) -> dict[str, Any]:
    """The row tags of a module-lane verdict: the ``top`` regions by ratio (name, why judged, ratio)."""
    return {"regions": [(e.name, e.declared, round(e.ratio, 4)) for e in sorted(errors, key=lambda e: -e.ratio)[:top]]}


def judge(name: str, recipe: str, errors: Sequence[RegionError]) -> ClaimComparison:
    """One verdict over every region of the step: each own error within LANE_FACTOR x what it
    owes; a failure names the regions over it, worst first."""
    over = sorted((e for e in errors if not e.passed), key=lambda e: -e.ratio)
    worst = max((e.ratio for e in errors), default=0.0)
    declared = sum(e.declared != "autocast" for e in errors)
    return compare_claim(
        f"{name}.{recipe}.module_lane_worst",
        worst,
        not over,
        f"each module's own error in the AMP step <= {LANE_FACTOR:g} x what it owes (a region under autocast: its "
        f"correctly rounded or fp32 error; a declared-fp32 region: its fp32 error), relative to float64 on the AMP "
        f"run's own inputs ({len(errors)} regions, {declared} declared fp32)",
        detail=(
            f"{name} / {recipe}: {len(over)} region(s) over their allowance:",
            *(
                f"{e.name} ({e.kind}, {e.declared}, output {e.output_dtype}): own error {e.amp:.3g} = {e.ratio:.3g} x "
                f"owed {e.owed:.3g} (fp32 {e.fp32:.3g}"
                + (f", correctly rounded {e.rounded:.3g}" if e.rounded is not None else "")
                + ")"
                for e in over[:6]
            ),
        ),
        expected=1.0,
        allowance=LANE_FACTOR,
        unit="x",
    )
