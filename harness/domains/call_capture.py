"""A call as source text: what a piece of Python did with torch, replayable without it.

A check that calls a catalogue row (a lambda, a module, a helper of the harness) cannot hand that
callable to a standalone script. :func:`capture` runs it under a ``TorchFunctionMode`` and keeps
the outermost torch calls it made (``torch.*``, ``F.*``, Tensor methods and properties, in order),
their tensor inputs saved exactly and every other argument as a Python literal. The result replays
the same calls on the same values: what autocast, a compiler or a kernel then does with them is
what the script shows. Calls torch makes inside another torch call are not seen (the mode is off
while a call runs), so a module's forward appears as the functional calls it makes.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, resolve_name


class NotReplayable(Exception):
    """The call used something a script cannot write down (a Python object, an unnamed function)."""


@dataclass(frozen=True)
class Captured:
    """Calls as source lines (``t3 = torch.mm(t0, t1)``), the tensors they read (by name), and the
    name of the result the caller returned (``None``: the code raised, after ``lines``)."""

    lines: tuple[str, ...]
    tensors: Mapping[str, torch.Tensor]
    result: str | None
    #: the error the last line raised while captured (its first line), if it did
    raised: str | None = None

    def function(self, name: str) -> str:
        """The calls as ``def name(x0, x1, ...)`` returning the result (None where it raised)."""
        end = f"return {self.result}" if self.result else "return None  # the check saw the line above raise"
        body = "\n".join(f"    {line}" for line in (*self.lines, end))
        return f"def {name}({', '.join(self.tensors)}):\n{body}"


def _name_of(func: Callable[..., Any]) -> str:
    """An importable dotted name of ``func`` that gives back the same object: its public name
    where torch's override table has one (``torch.fft.fft2``, not ``torch._C._fft.fft_fft2``)."""
    name, module, qualname = (getattr(func, k, None) for k in ("__name__", "__module__", "__qualname__"))
    candidates = [f"torch.{name}", resolve_name(func) or "", f"{module}.{qualname}"]
    for dotted in candidates:
        if dotted.startswith("torch.") and _resolves(dotted, func):
            return dotted
    raise NotReplayable(f"no importable name for {func!r}")


def _resolves(dotted: str, func: Any) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return bool(obj is func or obj == func)  # a property's __get__ is a new wrapper each time
    return False


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self.names: dict[int, str] = {}
        self.keep: list[Any] = []  # every named object stays alive: ids are not reused
        self.failure: str | None = None

    def _tensor(self, t: torch.Tensor) -> str:
        name = self.names.get(id(t))
        if name is None:
            name = f"x{len(self.tensors)}"
            self.tensors[name] = t.detach().clone()
            self.names[id(t)] = name
            self.keep.append(t)
        return name

    def arg(self, v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return self._tensor(v)
        if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
            inner = ", ".join(self.arg(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
        if isinstance(v, torch.Size):
            return repr(tuple(v))
        if isinstance(v, float) and not math.isfinite(v):
            return f"float({str(v)!r})"
        if v is None or isinstance(v, (bool, int, float, str, torch.dtype, torch.memory_format, torch.layout)):
            return repr(v)
        if isinstance(v, slice):
            return f"slice({self.arg(v.start)}, {self.arg(v.stop)}, {self.arg(v.step)})"
        if v is Ellipsis:
            return "..."
        if isinstance(v, torch.device):
            return f"torch.device({str(v)!r})"
        raise NotReplayable(f"an argument of type {type(v).__name__}")

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self.failure is not None:
            return func(*args, **kwargs)
        try:
            call = f"{_name_of(func)}({', '.join([self.arg(a) for a in args] + [f'{k}={self.arg(v)}' for k, v in kwargs.items()])})"
        except NotReplayable as exc:
            self.failure = str(exc)
            return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
        except Exception:
            self.lines.append(call)  # the call that raised: the script raises there too
            raise
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not any(isinstance(o, torch.Tensor) for o in outs):
            return out  # a query (dim, dtype, shape): its value is already a literal where used
        targets = []
        for o in outs:
            if isinstance(o, torch.Tensor) and id(o) in self.names:
                targets.append(self.names[id(o)])  # in place: the same tensor, the same name
            elif isinstance(o, torch.Tensor):
                name = f"y{len(self.lines)}" + (f"_{len(targets)}" if isinstance(out, (tuple, list)) else "")
                self.names[id(o)] = name
                self.keep.append(o)
                targets.append(name)
            else:
                targets.append("_")
        lhs = (
            targets[0]
            if not isinstance(out, (tuple, list))
            else ", ".join(targets) + ("," if len(targets) == 1 else "")
        )
        self.lines.append(f"{lhs} = {call}")
        return out


def capture(fn: Callable[..., Any], args: Sequence[Any], run: Callable[[Callable[[], Any]], Any]) -> Captured:
    """``run(lambda: fn(*args))``, its torch calls kept as source; ``run`` sets the context (autocast,
    seeds) and returns the tensor the caller judges. Raises :class:`NotReplayable` when a call's
    argument or function cannot be written down."""
    rec = _Recorder()
    result: str | None = None
    raised: str | None = None
    try:
        with rec:
            out = run(lambda: fn(*args))
    except RuntimeError as exc:
        raised = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    else:
        if isinstance(out, torch.Tensor):
            result = rec.names.get(id(out))
    if rec.failure is not None:
        raise NotReplayable(rec.failure)
    if raised is None and result is None:
        raise NotReplayable("the result is not the output of a torch call")
    return Captured(tuple(rec.lines), dict(rec.tensors), result, raised)


# -- calls kept as source, for the reproduction scripts ----------------------------------------
# -- calls kept as source (harness.domains.call_capture) ----------------------------------------
def case_functions(captures: Sequence[tuple[str, Captured]]) -> tuple[list[str], list[str], dict[str, torch.Tensor]]:
    """Each capture as a function ``case_i`` and the call of it on its saved inputs ``ci_x0, ...``."""
    defs, calls, tensors = [], [], {}
    for i, (_label, cap) in enumerate(captures):
        defs.append(cap.function(f"case_{i}"))
        tensors.update({f"c{i}_{k}": v for k, v in cap.tensors.items()})
        calls.append(f"case_{i}, [{', '.join(f'c{i}_{k}' for k in cap.tensors)}]")
    return defs, calls, tensors


def observe_src(device: str, dtype: torch.dtype) -> str:
    """Source of ``observe(run, inputs)``: the output dtype's name under autocast, or the error."""
    return f"""def observe(run, inputs):
    torch.manual_seed(0)  # random ops draw what they drew when the check ran
    try:
        with torch.autocast({device.split(":")[0]!r}, dtype={dtype!s}):
            out = run(*inputs)
    except RuntimeError as exc:
        return "raises: " + (str(exc).strip().splitlines() or [""])[0]
    return "no error" if out is None else str(out.dtype).removeprefix("torch.")"""


def observed_cases(
    cases: Sequence[tuple[str, Captured]], extra: Sequence[str], device: str, dtype: torch.dtype
) -> tuple[str, dict[str, torch.Tensor]]:
    """The cases' functions, ``observe`` and ``CASES = [(label, case_i, inputs<extra>), ...]``."""
    defs, calls, tensors = case_functions(cases)
    rows = "\n".join(
        f"    ({label!r}, {call}{more})," for (label, _), call, more in zip(cases, calls, extra, strict=True)
    )
    nl = "\n\n\n"
    return f"{nl.join(defs)}\n\n\n{observe_src(device, dtype)}\n\n\nCASES = [\n{rows}\n]", tensors
