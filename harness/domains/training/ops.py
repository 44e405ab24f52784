"""The first op where an AMP step leaves its budget: every aten op of one training step, against
the same op in float64 on the same inputs.

A dispatch mode (``TorchDispatchMode``) sees every aten op autocast and autograd run, forward and
backward. Before each floating op runs, it is run again in float64 on its inputs, upcast exactly:
the op's *local* error, ``max |out - ref| / max |ref|`` in units of the unit roundoff ``u`` of the
op's output dtype, is what the op itself adds, whatever error its inputs already carry (a fault
at one op shows there, not smeared over everything downstream). An op computed correctly and
rounded once to its output dtype errs by at most 1 u this way; :data:`OP_BUDGET_U` allows for the
kernels that round intermediates in their own dtype (measured on the harness's models: see the
constant). A cast between floating dtypes is judged against its input: it is one rounding
(:data:`CAST_BUDGET_U`). The
unit is never coarser than the recipe's own dtype (``floor``): an op or cast that stores a value
in a narrower format than the recipe promises (a float8 activation in a bf16 step) loses
precision the recipe does not allow, and is judged in u of the recipe's dtype. Views, copies and
random ops are not judged. Each op is recorded with the module
it ran in (forward; backward ops as ``(backward)``), its output dtype and shape, a hash of its
output's bytes (what :func:`first_difference` compares between two runs), and its local error.

Cost: one step with every floating op run twice (once in float64): a few times one step of the
model, paid only where it is asked for (a failed training check's diagnosis, a fingerprint run).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from harness.numerics.formats import format_of

if TYPE_CHECKING:
    pass

#: The local error (in units of u of the op's output dtype) an op may show: 1 u for rounding its
#: output once, plus what kernels that keep low-precision intermediates add (a convolution's
#: backward, a layer norm's reductions). Measured on one step of each harness model, clean, bf16 and
#: fp16 autocast: at most 3.8 u (cnn_bn fp16, convolution_backward; tiny LM 2.8 u, MLP 0.8 u;
#: tests/test_op_localiser.py keeps the clean maximum below the budget). About twice that.
OP_BUDGET_U = 8.0

#: A cast's error against its input: one rounding to nearest errs by less than 1 u of the value,
#: so of the tensor's largest (no intermediates: nothing else to allow for).
CAST_BUDGET_U = 1.0

#: Ops that move or reinterpret data without computing: never judged.
NOT_COMPUTED = frozenset(
    {
        "_to_copy",
        "to",
        "copy_",
        "clone",
        "detach",
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "split",
        "split_with_sizes",
        "unbind",
        "cat",
        "stack",
        "contiguous",
        "alias",
        "as_strided",
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "new_empty",
        "new_zeros",
        "new_ones",
        "fill_",
        "zero_",
        "index_select",
        "embedding",
        "embedding_dense_backward",
        "lift_fresh",
        "_local_scalar_dense",
    }
)


@dataclass(frozen=True)
class OpCall:
    """An aten call written out: ``source`` names its tensors ``t0, t1, ...`` (``tensors``)."""

    source: str
    tensors: dict[str, torch.Tensor]


def _literal(a: Any) -> str | None:
    """A non-tensor argument as Python source, or None where it has none."""
    if a is None or isinstance(a, (bool, int, float, str)):
        return repr(a) if not (isinstance(a, float) and not math.isfinite(a)) else f"float({str(a)!r})"
    if isinstance(a, (torch.dtype, torch.layout, torch.memory_format)):
        return str(a)
    if isinstance(a, torch.device):
        return f"torch.device({str(a)!r})"
    if isinstance(a, (list, tuple)):
        parts = [_literal(x) for x in a]
        if any(p is None for p in parts):
            return None
        inner = ", ".join(p for p in parts if p is not None)
        return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
    return None


def op_call(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> OpCall | None:
    """``func(*args, **kwargs)`` as source with its tensors copied (None: an argument that has no
    source form). Tensors inside lists are named too."""
    tensors: dict[str, torch.Tensor] = {}

    def src(a: Any) -> str | None:
        if isinstance(a, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = a.detach().clone()
            return name
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            parts = [src(x) for x in a]
            return None if any(p is None for p in parts) else f"[{', '.join(p for p in parts if p is not None)}]"
        return _literal(a)

    parts = [src(a) for a in args] + [None if (v := src(x)) is None else f"{k}={v}" for k, x in kwargs.items()]
    if any(p is None for p in parts):
        return None
    target = f"torch.ops.{func.namespace}.{func.overloadpacket.__name__}.{func._overloadname}"
    return OpCall(f"{target}({', '.join(p for p in parts if p is not None)})", tensors)


@dataclass(frozen=True)
class OpPrint:
    """One aten op of a step: where it ran, what it produced, and its own error."""

    index: int
    op: str
    module: str
    dtype: str
    shape: tuple[int, ...]
    digest: str
    #: local error in units of u of ``unit`` (``dtype``, or the recipe's dtype where ``dtype`` is
    #: narrower); None where the op is not judged
    error_u: float | None
    #: the first op over its budget only: the call, as source, and its tensor inputs (by the names
    #: the source uses), kept so that ``amp-harness repro`` can run it alone
    call: OpCall | None = field(default=None, compare=False, repr=False)
    #: the dtype whose unit roundoff ``error_u`` counts in ("" : ``dtype``'s)
    unit: str = ""
    #: a cast: judged against its input (the reproduction's reference too)
    cast: bool = False

    @property
    def budget_u(self) -> float:
        return CAST_BUDGET_U if self.cast else OP_BUDGET_U

    @property
    def over_budget(self) -> bool:
        return self.error_u is not None and self.error_u > self.budget_u

    def describe(self) -> str:
        unit = self.unit or self.dtype
        of = "" if unit == self.dtype else f" of {unit} (the recipe's dtype; {self.dtype} is narrower)"
        err = "" if self.error_u is None else f", its own error {self.error_u:.3g} u{of} (budget {self.budget_u:g} u)"
        return f"op #{self.index} aten.{self.op} in {self.module} -> {self.dtype}{list(self.shape)}{err}"


def _first_tensor(out: Any) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return next((t for t in out if isinstance(t, torch.Tensor)), None)
    return None


def _digest(t: torch.Tensor) -> str:
    data = t.detach().contiguous().cpu()
    if data.dtype.is_floating_point and data.dtype not in (torch.float16, torch.float32, torch.float64):
        # numpy has no bfloat16 or float8: hash the bits (float4's packed pairs are one byte too)
        data = data.view({1: torch.uint8, 2: torch.int16}[data.element_size()])
    return hashlib.sha1(data.numpy().tobytes()).hexdigest()[:16]


#: aten's cast between dtypes (``Tensor.to``): judged against its input
CAST = "_to_copy"


def unit_of(dtype: torch.dtype, floor: torch.dtype | None) -> torch.dtype | None:
    """The dtype whose unit roundoff an op's error counts in: its output's, or the recipe's own
    (``floor``) where the output's format is coarser; None for a format the harness does not know."""
    try:
        u = format_of(dtype).unit_roundoff
        if floor is not None and format_of(floor).unit_roundoff < u:
            return floor
    except ValueError:
        return None
    return dtype


class OpRecorder(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records :class:`OpPrint` of every aten op while active; ``module_of`` names the module
    running now (a stack kept by module hooks); ``floor``: the recipe's dtype, the coarsest unit
    an op is judged in (None: each op's own output dtype)."""

    def __init__(self, module_of: Callable[[], str], floor: torch.dtype | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: list[OpPrint] = []
        self._module_of = module_of
        self._floor = floor
        self._captured = False  # the first op over its budget keeps its call (OpPrint.call)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func.overloadpacket.__name__)
        judged = (
            name.rstrip("_") not in NOT_COMPUTED
            and torch.Tag.nondeterministic_seeded not in func.tags
            and any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in (*args, *kwargs.values()))
        )
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        cast = name == CAST and source is not None and source.is_floating_point()
        ref = None
        if cast:
            assert source is not None
            ref = source.detach().double()  # a cast's exact result is its input
        elif judged:
            try:  # before the op runs: an in-place op overwrites its inputs
                up = tree_map(
                    lambda a: a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a, args
                )
                kw = tree_map(
                    lambda a: a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a, kwargs
                )
                ref = _first_tensor(func(*up, **kw))
            except (RuntimeError, TypeError, NotImplementedError):
                ref = None
        out = func(*args, **kwargs)
        first = _first_tensor(out)
        if first is None or not first.is_floating_point():
            return out
        error = None
        unit = unit_of(first.dtype, self._floor)
        if ref is not None and unit is not None and ref.shape == first.shape:
            r, o = ref.detach().double(), first.detach().double()
            scale = float(r.abs().max()) if r.numel() else 0.0
            diff = float((o - r).abs().max()) if r.numel() else 0.0
            if math.isfinite(scale) and scale > 0:
                error = (diff / scale) / format_of(unit).unit_roundoff
            elif diff == 0.0:
                error = 0.0
            else:
                error = math.inf
        op = OpPrint(
            len(self.ops),
            name,
            self._module_of(),
            str(first.dtype).removeprefix("torch."),
            tuple(first.shape),
            _digest(first),
            error,
            unit="" if unit in (None, first.dtype) else str(unit).removeprefix("torch."),
            cast=cast,
        )
        if op.over_budget and not self._captured:
            self._captured = True
            # its inputs as they were: an op that wrote into them (in place, out=) is not kept
            if not name.endswith("_") and "out" not in kwargs:
                op = replace(op, call=op_call(func, args, kwargs))
        self.ops.append(op)
        return out


def record_step(model: nn.Module, step: Callable[[], torch.Tensor], floor: torch.dtype | None = None) -> list[OpPrint]:
    """Every aten op of ``step()`` (a forward returning the loss; its backward is run here) on
    ``model``, with the module each forward op ran in."""
    stack: list[str] = []
    phase = ["(outside the model)"]  # the label of ops run outside any module: the loss, then backward
    handles = []
    for name, module in model.named_modules():

        def pre(_m: nn.Module, _args: Any, _name: str = name or "(model)") -> None:
            stack.append(_name)

        def post(_m: nn.Module, _args: Any, _out: Any) -> None:
            stack.pop()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    recorder = OpRecorder(lambda: stack[-1] if stack else phase[0], floor)
    try:
        with recorder:
            loss = step()
            phase[0] = "(backward)"
            loss.backward()  # type: ignore[no-untyped-call]
    finally:
        for h in handles:
            h.remove()
    return recorder.ops


def first_over_budget(ops: Sequence[OpPrint]) -> OpPrint | None:
    """The first op, in execution order, whose own error leaves its budget (:data:`OP_BUDGET_U`, a
    cast :data:`CAST_BUDGET_U`)."""
    return next((o for o in ops if o.over_budget), None)


def localised(first: OpPrint | None, ops: int) -> str:
    """What a failure message says of a step's ops: the first over its budget, or that none is."""
    if first is None:
        return (
            f"every one of the step's {ops} aten ops stays within {OP_BUDGET_U:g} u of float64 "
            f"(a cast within {CAST_BUDGET_U:g} u of its input)"
        )
    return f"first op over its budget (of {ops}): {first.describe()}"


def first_difference(a: Sequence[OpPrint], b: Sequence[OpPrint]) -> tuple[OpPrint | None, OpPrint | None] | None:
    """The first op where two runs of the same step part: a different op, module, dtype, shape or
    output bits (None: the same op sequence, bitwise)."""
    for x, y in zip(a, b, strict=False):
        if (x.op, x.module, x.dtype, x.shape, x.digest) != (y.op, y.module, y.dtype, y.shape, y.digest):
            return x, y
    if len(a) != len(b):
        n = min(len(a), len(b))
        return (a[n] if n < len(a) else None), (b[n] if n < len(b) else None)
    return None
