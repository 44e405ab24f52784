"""Error budgets and SQNR floors of a scaled (fp8) matrix product, derived from the formats.

A scaled matmul computes ``(q(a s_a) / s_a) @ (q(b s_b) / s_b)`` with products summed in float32 and
the result rounded to the output dtype. Two judgements follow from the operands' formats:

* **Worst case, elementwise** (Higham's model, as :mod:`harness.numerics.budgets`): one cast of
  ``a s_a`` errs by at most ``u |a s_a| + eta`` (``u`` the unit roundoff: e4m3 2^-4, e5m2 2^-3;
  ``eta`` half the smallest subnormal), so the dequantised element errs by ``u|a| + eta/s_a``; the
  product then errs by ``E_a |b| + |a| E_b + E_a E_b``, accumulation adds ``gamma_{k+3}(u_acc)``
  (k products, plus the two divisions by the scales an emulated matmul makes), and the output
  rounding ``u_out |c| + eta_out``. A fault that breaks a product or a scale (an operand not
  descaled, a wrong axis) fails it.
* **Typical, as SQNR** (the standard model of rounding error: each rounding an independent error
  uniform within half an ulp, so of RMS at most ``u/sqrt(3)`` relative): the noise of a product of
  independently rounded operands is at most ``(u_a^2 + u_b^2 + (k+1) u_acc^2 + u_out^2) / 3`` of the
  signal power. The floor ``-10 log10`` of it is what the formats allow; a cast into a coarser
  format than the recipe names (e5m2 where e4m3 belongs) falls below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from harness.numerics.formats import FP32, FloatFormat
from harness.numerics.scaled import sqnr_db
from harness.numerics.tolerance import gamma


@dataclass(frozen=True)
class Operand:
    """One operand of a scaled matmul: its float64 values, the fp8 format it was cast to (None:
    not cast) and its float32 scales (broadcastable to it)."""

    values: torch.Tensor
    fmt: FloatFormat | None = None
    scale: torch.Tensor | None = None

    def error(self) -> torch.Tensor:
        """Bound on |dequantised - exact| per element."""
        a = self.values.abs()
        if self.fmt is None or self.scale is None:
            return torch.zeros_like(a)
        s = self.scale.to(torch.float64).clamp_min(torch.finfo(torch.float64).tiny)
        return self.fmt.unit_roundoff * a + (self.fmt.smallest_subnormal / 2) / s

    @property
    def u(self) -> float:
        return 0.0 if self.fmt is None else self.fmt.unit_roundoff

    @property
    def short(self) -> str:
        return "high precision" if self.fmt is None else self.fmt.short

    def relative_noise(self) -> float:
        """Noise power of the cast relative to the operand's: u^2 / 3 (the standard model)."""
        return self.u**2 / 3

    #: how :meth:`error` and :meth:`relative_noise` are derived, for a budget's origin
    origin = "casts u|x| + eta/scale per element, noise u^2/3 each"


class Quantised(Protocol):
    """What :func:`budget` needs of an operand: its float64 values, a bound on each element's
    error once dequantised, and the cast's noise power relative to the operand's (for the SQNR
    floor). :class:`Operand` (per-tensor or per-row scales) and block-scaled operands implement it."""

    @property
    def values(self) -> torch.Tensor: ...

    @property
    def short(self) -> str: ...

    def error(self) -> torch.Tensor: ...

    def relative_noise(self) -> float: ...

    @property
    def origin(self) -> str: ...


@dataclass(frozen=True)
class ScaledBudget:
    """Elementwise bound, SQNR floor, and the text of their derivation."""

    bound: torch.Tensor
    sqnr_floor_db: float
    origin: str


def budget(a: Quantised, b: Quantised, out: FloatFormat = FP32, acc: FloatFormat = FP32) -> ScaledBudget:
    """The budget of ``a @ b`` (a: m x k, b: k x n) against its float64 value."""
    k = a.values.shape[-1]
    aa, ba = a.values.abs(), b.values.abs()
    ea, eb = a.error(), b.error()
    inputs = ea @ ba + aa @ eb + ea @ eb
    accumulation = gamma(k + 3, acc.unit_roundoff) * ((aa + ea) @ (ba + eb))
    ref = (a.values @ b.values).abs()
    uo = out.unit_roundoff
    total = inputs + accumulation
    bound = total + uo * (ref + total) + out.smallest_subnormal / 2  # the output's one rounding
    noise = a.relative_noise() + b.relative_noise() + ((k + 1) * acc.unit_roundoff**2 + uo**2) / 3
    floor = -10.0 * math.log10(noise)
    names = " x ".join(o.short for o in (a, b))
    origin = (
        f"{names}: {a.origin}, float32 accumulation gamma_{k + 3}, output rounded to {out.short}; "
        f"SQNR floor -10 log10(n_a + n_b + ((k+1) u_acc^2 + u_out^2)/3) = {floor:.1f} dB (n: a cast's relative noise)"
    )
    return ScaledBudget(bound, floor, origin)


def sqnr(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """SQNR of ``actual`` against the float64 ``reference``, in dB."""
    r = reference.to(torch.float64)
    noise = (actual.to(torch.float64) - r).pow(2).sum().item()
    return sqnr_db(r.pow(2).sum().item(), noise)
