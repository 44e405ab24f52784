"""An AMP step's op fingerprint: one record per aten op (where it ran, what it produced, its own
error against float64), and where two runs of the same step part. Pure data, no torch at import:
``amp-harness diff`` reads fingerprints from run reports without loading torch; the dispatch mode
that records them is in :mod:`harness.domains.engines.training.diagnosis`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: The local error (in units of u of the op's output dtype) an op may show: 1 u for rounding its
#: output once, plus what kernels that keep low-precision intermediates add (a convolution's
#: backward, a layer norm's reductions). Measured on one step of each harness model, clean, bf16 and
#: fp16 autocast: at most 3.8 u (cnn_bn fp16, convolution_backward; tiny LM 2.8 u, MLP 0.8 u;
#: tests/test_op_localiser.py keeps the clean maximum below the budget). About twice that.
OP_BUDGET_U = 8.0

#: A cast's error against its input: one rounding to nearest errs by less than 1 u of the value,
#: so of the tensor's largest (no intermediates: nothing else to allow for).
CAST_BUDGET_U = 1.0


@dataclass(frozen=True)
class OpCall:
    """An aten call written out: ``source`` names its tensors ``t0, t1, ...`` (``tensors``)."""

    source: str
    tensors: dict[str, torch.Tensor]


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
