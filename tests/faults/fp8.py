"""Broken fp8 scaling code. Each wraps torchao's correct scaling and corrupts it the way a real bug
would; the fp8 suite gets one through its ``fp8_scaling_under_test`` fixture, or torchao's own
functions are patched where the suite uses torchao directly (Float8Linear, training, MX)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from harness.domains.fp8.adapters import TorchaoScaling
from harness.domains.fp8.delayed import TorchDelayedScaling
from harness.numerics.formats import FP8_E4M3FN, FP8_E5M2
from harness.numerics.scaled import AMAX_EPS, CastSpec, Granularity


class WrongAxis(TorchaoScaling):
    """Axiswise scales reduced over the other dimension (per column where per row belongs)."""

    name = "wrong axis"

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        if spec.granularity is Granularity.AXIS:
            spec = replace(spec, axis=0 if spec.axis in (-1, 1) else -1)
        return super().scale(x, spec)


class AmaxIgnoresNegatives(TorchaoScaling):
    """amax = max(x) instead of max(|x|): large negative values saturate."""

    name = "amax ignores negative values"

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        fmax = spec.fmt.max
        amax = x.max() if spec.granularity is Granularity.TENSOR else x.amax(dim=spec.axis, keepdim=True)
        s = (fmax / amax.to(torch.float64).clamp(min=AMAX_EPS)).to(torch.float32)
        return torch.exp2(torch.floor(torch.log2(s))) if spec.power_of_2 else s


class E5m2ForE4m3(TorchaoScaling):
    """e5m2 (2 mantissa bits) where the recipe names e4m3 (3 bits): scales and casts both."""

    name = "e5m2 where e4m3 belongs"

    def _swap(self, spec: CastSpec) -> CastSpec:
        return replace(spec, fmt=FP8_E5M2) if spec.fmt is FP8_E4M3FN else spec

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        return super().scale(x, self._swap(spec))

    def cast(self, x: torch.Tensor, scale: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        return super().cast(x, scale, self._swap(spec))


class ScaleOffByTwo(TorchaoScaling):
    """Every scale twice what it should be (a factor of 2 lost in a power-of-two rounding)."""

    name = "scale off by a factor of two"

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        return super().scale(x, spec) * 2


class StaleAmax(TorchaoScaling):
    """The scale of the tensor's first row stands for all of it (a stale or partial amax, as a
    delayed-scaling history that missed a spike): the rest overflow and saturate silently."""

    name = "stale amax"

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        s = super().scale(x[:1], spec)
        if spec.granularity is Granularity.AXIS and spec.axis in (-1, 1):
            return s.expand(x.shape[0], 1)  # the first row's scale for every row
        return s


class RoundsTowardZero(TorchaoScaling):
    """The cast truncates (rounds toward zero) instead of rounding to nearest."""

    name = "cast rounds toward zero"

    def cast(self, x: torch.Tensor, scale: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        good = super().cast(x, scale, spec)
        exact = x.to(torch.float64) * scale.to(torch.float64)
        back = good.to(torch.float64)
        bits = good.view(torch.uint8).clone()
        up = (back.abs() > exact.abs()) & torch.isfinite(exact) & (bits & 0x7F != 0)
        bits[up] -= 1  # one step toward zero, same sign
        return bits.view(good.dtype)


BROKEN_SCALING: dict[str, type[TorchaoScaling]] = {
    c.__name__: c for c in (WrongAxis, AmaxIgnoresNegatives, E5m2ForE4m3, ScaleOffByTwo, StaleAmax, RoundsTowardZero)
}


# -- patches of torchao itself (``inject(..., patches=...)``: factory(original) -> replacement) --------------
def doubled_scale(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's tensor_to_scale, times two: Float8Linear's casts saturate their largest values."""

    def broken(*args: Any, **kwargs: Any) -> torch.Tensor:
        return original(*args, **kwargs) * 2

    return broken


def exact_pow2(original: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A torchao whose power-of-two rounding is exact (frexp): the registered finding "appears fixed"."""

    def fixed(scale: torch.Tensor) -> torch.Tensor:
        _, e = torch.frexp(scale)
        exact = torch.ldexp(torch.ones_like(scale), e - 1)
        return torch.where(torch.isfinite(scale) & (scale > 0), exact, scale)

    return fixed


class PlainTorchScaling:
    """A user's own correct fp8 scaling in plain torch, no torchao (what the adapter docs show): it
    must pass every scaling check, power-of-two scales included (its rounding is exact)."""

    name = "plain torch"

    def scale(self, x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        a = x.abs()
        amax = a.amax() if spec.granularity is Granularity.TENSOR else a.amax(dim=spec.axis, keepdim=True)
        s = (spec.fmt.max / amax.to(torch.float64).clamp(min=AMAX_EPS)).to(torch.float32)
        if spec.power_of_2:
            _, e = torch.frexp(s)
            s = torch.where(torch.isfinite(s) & (s > 0), torch.ldexp(torch.ones_like(s), e - 1), s)
        return s

    def cast(self, x: torch.Tensor, scale: torch.Tensor, spec: CastSpec) -> torch.Tensor:
        fmax = spec.fmt.max
        from harness.numerics.formats import torch_dtype

        return (x.to(torch.float32) * scale).clamp(-fmax, fmax).to(torch_dtype(spec.fmt))


# -- decodes and casts of the format checks: torch's own, then broken ones --------------------------------------
def torch_decode(dtype_name: str, device: torch.device) -> list[float]:
    """torch's decode of codes 0..255 (what the suite's fixture does)."""
    values = torch.arange(256, dtype=torch.uint8, device=device).view(getattr(torch, dtype_name)).float().cpu()
    return [float(v) for v in values.tolist()]


def torch_e8m0_cast(values: Any, device: torch.device) -> list[int]:
    """torch's fp32 -> e8m0 cast, as codes (what the suite's fixture does)."""
    t = torch.tensor(list(values), dtype=torch.float32, device=device).to(torch.float8_e8m0fnu)
    return [int(c) for c in t.view(torch.uint8).cpu().tolist()]


def decode_flushing_subnormals(dtype_name: str, device: torch.device) -> list[float]:
    """torch's decode with subnormal codes read as zero (a DAZ mode in a conversion path)."""
    from harness.numerics.formats import format_of

    values = torch.arange(256, dtype=torch.uint8, device=device).view(getattr(torch, dtype_name)).float().cpu()
    out = [float(v) for v in values.tolist()]
    if dtype_name == "float8_e8m0fnu":
        return out
    fmt = format_of(dtype_name)
    return [0.0 if 0 < abs(v) < fmt.smallest_normal else v for v in out]


def e8m0_rounding_down(values: Any, device: torch.device) -> list[int]:
    """An e8m0 cast that truncates to the power of two below (the exponent field, mantissa dropped)."""
    t = torch.tensor(list(values), dtype=torch.float32, device=device)
    exponent = (t.view(torch.int32) >> 23) & 0xFF
    return [int(e) for e in exponent.cpu().tolist()]


def fp4_truncating(original: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """torchao's fp32 -> fp4 with the mantissa bit cleared: every odd code rounds toward zero."""

    def broken(x: torch.Tensor) -> torch.Tensor:
        return torch.bitwise_and(original(x), 0b1110)

    return broken


def compile_truncating(original: Callable[..., Any]) -> Callable[..., Any]:
    """A 'compiler' whose fp8 casts round toward zero: what a code generator's wrong rounding mode does."""

    def compile_fn(fn: Callable[..., Any], backend: Any) -> Callable[..., Any]:
        def run(x: torch.Tensor) -> torch.Tensor:
            good: torch.Tensor = fn(x)
            bits = good.view(torch.uint8).clone()
            up = (good.float().abs() > x.abs()) & torch.isfinite(x) & (bits & 0x7F != 0)
            bits[up] -= 1
            return bits.view(good.dtype)

        return run

    return compile_fn


def rowwise_grad_output_e5m2(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A torchao whose rowwise recipe casts grad_output to e5m2 (a recipe changed in a release)."""

    def from_recipe_name(name: Any) -> Any:
        config = original(name)
        if str(getattr(name, "value", name)) != "rowwise":
            return config
        cast = replace(config.cast_config_grad_output, target_dtype=torch.float8_e5m2)
        # torchao requires grad_output in one dtype for both matmuls that use it
        return replace(config, cast_config_grad_output=cast, cast_config_grad_output_for_grad_weight=cast)

    return from_recipe_name


#: what torch 2.13's CPU ``_scaled_mm`` raises where oneDNN is capped below its fp8 matmul
#: (``ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16`` or ``AVX2`` on a CPU that exposes AMX)
NO_FP8_KERNEL = "could not create a primitive descriptor for the matmul primitive"


def scaled_mm_without_kernel(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch._scaled_mm`` on a kernel set without an fp8 matmul: every call raises as oneDNN does."""

    def missing(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise RuntimeError(NO_FP8_KERNEL)

    return missing


# -- delayed scaling (suites/fp8/test_delayed_scaling.py) ---------------------------------------------
class NeverRolls(TorchDelayedScaling):
    """A history that fills once and never rolls: the first window's amaxes decide forever."""

    def update(self, amax: float) -> None:
        if self._filled < self.cfg.history_len:
            super().update(amax)


class MarginTwice(TorchDelayedScaling):
    """The margin divides the scale twice."""

    def update(self, amax: float) -> None:
        before = self._scale.clone()
        super().update(amax)
        if not torch.equal(before, self._scale):
            self._scale = self._scale / 2.0**self.cfg.margin


class NonFiniteSetsScale(TorchDelayedScaling):
    """No finite guard: an overflowed step's inf amax sets the scale to fp8_max / inf = 0 (every
    later cast is 0 until the inf leaves the window), a NaN sets it to NaN."""

    def _next_scale(self, window: torch.Tensor) -> torch.Tensor:
        selected = self._selected(window)
        return self._scale if float(selected) == 0 else self._unclamped_scale(selected)


class ScaleLagsAStep(TorchDelayedScaling):
    """The scale is computed before the step's amax enters the window: every step casts with the
    scale of the step before last."""

    def update(self, amax: float) -> None:
        self._scale = self._next_scale(self._history[-self._filled :]) if self._filled else self._scale
        self._history = torch.roll(self._history, -1)
        self._history[-1] = torch.tensor(amax, dtype=torch.float32).abs()
        self._filled = min(self._filled + 1, self.cfg.history_len)


class OverflowStoresInf(TorchDelayedScaling):
    """An amax so small that fp8_max / amax overflows stores the scale inf (its reciprocal, the
    dequantisation scale, is 0), as TransformerEngine's fused kernel did before it clamped."""

    def _next_scale(self, window: torch.Tensor) -> torch.Tensor:
        selected = self._selected(window)
        if not (bool(torch.isfinite(selected)) and float(selected) > 0):
            return self._scale
        return self._unclamped_scale(selected)


class PythonPathDelayedScaling(TorchDelayedScaling):
    """Not a fault: a recipe written as TransformerEngine's Python path is (its buffer layout, slot
    0 the current step's amax and zeroed after the update; ``torch.max``; ``fp8_max / amax`` on
    tensors, which torch evaluates as ``reciprocal() * fp8_max``). It must pass. Its kept amaxes
    end up at the end of the buffer, where the harness's recipe reads its history."""

    def update(self, amax: float) -> None:
        self._history[0] = torch.tensor(amax, dtype=torch.float32).abs()
        self._filled = min(self._filled + 1, self.cfg.history_len)
        latest = self._history[0].clone()
        selected = torch.max(self._history, dim=0).values if self.cfg.algorithm == "max" else latest
        sf = (self.cfg.fmt.max / selected) / (2**self.cfg.margin)
        sf = torch.where(selected > 0.0, sf, self._scale)
        sf = torch.where(torch.isfinite(selected), sf, self._scale)
        self._scale = torch.where(torch.isinf(sf), torch.full_like(sf, torch.finfo(torch.float32).max), sf)
        if self.cfg.history_len > 1:
            self._history = torch.roll(self._history, -1, 0)
        self._history[0] = 0.0


class FusedKernelDelayedScaling(TorchDelayedScaling):
    """Not a fault: TransformerEngine's fused bulk update in plain torch, the specification's other
    admitted path (a NaN in the window ignored by ``fmaxf``, a step with amax 0 not recorded,
    ``fp8_max x 2^-margin`` divided by the amax in one float32 rounding). It must pass."""

    def update(self, amax: float) -> None:
        a = torch.tensor(amax, dtype=torch.float32).abs()
        if float(a) == 0:
            return
        self._history = torch.roll(self._history, -1)
        self._history[-1] = a
        self._filled = min(self._filled + 1, self.cfg.history_len)
        window = self._history[-self._filled :]
        finite_or_inf = window[~torch.isnan(window)]
        if self.cfg.algorithm == "most_recent":
            selected = a
        else:
            selected = finite_or_inf.max() if finite_or_inf.numel() else torch.tensor(0.0)
        if bool(torch.isfinite(selected)) and float(selected) > 0:
            scaled_max = self.cfg.fmt.max * 2.0**-self.cfg.margin  # exact in float64
            q = (scaled_max / selected.double()).float()
            self._scale = q if bool(torch.isfinite(q)) else torch.tensor(torch.finfo(torch.float32).max)


class RoundTripDropsHistory(TorchDelayedScaling):
    """state_dict keeps the scale and drops the history: a resumed run forgets its window."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._scale = state["scale"].clone()


def tensor_to_scale_doubled(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's ``tensor_to_scale`` returning twice its scale (a binade off: saturating casts)."""

    def tensor_to_scale(*args: Any, **kwargs: Any) -> torch.Tensor:
        return real(*args, **kwargs) * 2

    return tensor_to_scale


def scaled_mm_without_scale_b(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch._scaled_mm`` that drops its second operand's scale (multiplies by 1 instead: a
    kernel reading the wrong scale pointer), so every output is off by that operand's scale."""

    def scaled_mm(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("scale_b") is not None:
            kwargs["scale_b"] = torch.ones_like(kwargs["scale_b"])
        return real(a, b, *args, **kwargs)

    return scaled_mm


def fp8_decode_subnormals_flushed(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float8 -> float32 conversion flushes subnormal codes to (signed) zero: a
    decoding table that forgot the subnormals."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and out.dtype is torch.float32:
            tiny = out.abs() < float(torch.finfo(self.dtype).smallest_normal)
            out = torch.where(tiny, out * 0, out)
        return out

    return to


def e8m0_cast_rounding_down(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> e8m0 cast takes the power of two below (a truncating exponent
    extraction) where the nearest one is above; every other conversion is untouched."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype is torch.float8_e8m0fnu:
            finite = torch.isfinite(self) & (self > 0)
            below = (torch.frexp(self.double())[1] - 1 + 127).clamp(0, 254).to(torch.uint8)
            out = torch.where(finite, below, out.view(torch.uint8)).view(torch.float8_e8m0fnu)
        return out

    return to
