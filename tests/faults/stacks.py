"""Faulty stacks that need no harness: patches of torch and torchao that both an injected conftest
and a fresh interpreter running a standalone reproduction can install (``install``), so that a
failed check's script is shown to exit 1 on the faulty stack and 0 on the clean one.

Each is a factory ``fault(original) -> replacement``, like :mod:`faults.autocast` (whose patches
are harness-free too and are installed the same way).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch


def update_never_backing_off(real: Callable[..., None]) -> Callable[..., None]:
    """``GradScaler.update`` that keeps the scale where an overflow should halve it."""

    def update(self: Any, new_scale: Any = None) -> None:
        before = None if new_scale is not None or self._scale is None else self._scale.clone()
        real(self, new_scale)
        if before is not None:
            self._scale.copy_(torch.maximum(self._scale, before))

    return update


def tensor_to_scale_doubled(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's ``tensor_to_scale`` returning twice its scale (a binade off: saturating casts)."""

    def tensor_to_scale(*args: Any, **kwargs: Any) -> torch.Tensor:
        return real(*args, **kwargs) * 2

    return tensor_to_scale


def fp16_cast_toward_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float16 cast rounds toward zero where it should round up in
    magnitude (a truncating conversion kernel); every other conversion is untouched."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype is torch.float16:
            up = (out.float().abs() > self.abs()) & (out != 0)
            out = out.clone()
            out.view(torch.int16)[up] -= 1  # one code toward zero (sign and magnitude)
        return out

    return to


def compile_rounding_softmax(real: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` whose compiled functions return a ``softmax`` stage kept to 4 significand
    bits (a compiler losing precision in one stage; eager is untouched)."""

    def compile(fn: Any = None, **kwargs: Any) -> Any:
        compiled = real(fn, **kwargs)

        def run(*args: Any, **kw: Any) -> Any:
            out = compiled(*args, **kw)
            if isinstance(out, dict) and "softmax" in out:
                m, e = torch.frexp(out["softmax"].detach().float())
                out = {**out, "softmax": torch.ldexp(torch.round(m * 16) / 16, e).to(out["softmax"].dtype)}
            return out

        return run

    return compile


#: kept alive while installed: a dispatcher registration lasts as long as its Library
_LIBRARIES: list[Any] = []


def lossy_gelu(bits: int = 3) -> Callable[..., torch.Tensor]:
    """An aten::gelu kernel keeping only ``bits`` significand bits of a bf16/fp16 output; float64
    calls stay exact, so the op localiser's reference is unaffected (a kernel regression in one op)."""
    import math

    def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        y = 0.5 * x.double() * (1 + torch.erf(x.double() / math.sqrt(2)))
        if x.dtype in (torch.bfloat16, torch.float16):
            m, e = torch.frexp(y)
            y = torch.ldexp(torch.round(m * 2.0**bits) / 2.0**bits, e)
        return y.to(x.dtype)

    return gelu


def register_lossy_gelu(bits: int = 3) -> Any:
    """:func:`lossy_gelu` as aten::gelu's CPU kernel while the returned Library lives."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
        lib.impl("gelu", lossy_gelu(bits), "CPU")  # type: ignore[no-untyped-call]
    return lib


def install_lossy_gelu(bits: int = 3) -> None:
    """:func:`register_lossy_gelu` for the rest of this interpreter (the training controls' faulty
    op; ``faults.training.lossy_gelu_kernel`` registers the same kernel and undoes it on exit)."""
    _LIBRARIES.append(register_lossy_gelu(bits))


#: name -> (patched attribute, factory): what ``install`` and the injected conftests apply
STACKS: dict[str, tuple[str, str]] = {
    "layer_norm_in_low_precision": ("torch.nn.functional.layer_norm", "faults.autocast.layer_norm_in_low_precision"),
    "scaler_never_backs_off": ("torch.amp.GradScaler.update", "faults.stacks.update_never_backing_off"),
    "fp8_scale_doubled": ("torchao.float8.float8_utils.tensor_to_scale", "faults.stacks.tensor_to_scale_doubled"),
    "fp16_cast_toward_zero": ("torch.Tensor.to", "faults.stacks.fp16_cast_toward_zero"),
    "compile_rounding_softmax": ("torch.compile", "faults.stacks.compile_rounding_softmax"),
}


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def install(name: str) -> None:
    """Make this interpreter's stack the faulty one ``name`` (a patch of STACKS, or ``lossy_gelu``)."""
    if name == "lossy_gelu":
        install_lossy_gelu()
        return
    target, factory = STACKS[name]
    owner, _, attr = target.rpartition(".")
    setattr(_resolve(owner), attr, _resolve(factory)(_resolve(target)))
