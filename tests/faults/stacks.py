"""Faulty stacks that need no harness: patches of torch and torchao that both an injected conftest
and a fresh interpreter running a standalone reproduction can install (``installed``), so that a
failed check's script is shown to exit 1 on the faulty stack and 0 on the clean one.

Each is a factory ``fault(original) -> replacement``, like :mod:`faults.autocast` (whose patches
are harness-free too and are installed the same way).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Callable, Iterator
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


def scale_a_quarter_high(real: Callable[..., Any]) -> Callable[..., Any]:
    """``GradScaler.scale`` multiplying the loss by 1.25 x the scale ``unscale_`` divides by: every
    fp16 + GradScaler step is a quarter too long (the MLP's parity: 13x its allowance)."""

    def scale(self: Any, outputs: Any) -> Any:
        return real(self, outputs) * 1.25

    return scale


def sgd_without_weight_decay(real: Callable[..., None]) -> Callable[..., None]:
    """torch's functional ``sgd`` (what ``SGD.step`` calls, every implementation) dropping the
    weight decay it was given: each step misses ``lr * weight_decay * p``."""

    def sgd(*args: Any, **kwargs: Any) -> None:
        real(*args, **{**kwargs, "weight_decay": 0.0})

    return sgd


def scaler_stepping_on_overflow(real: Callable[..., Any]) -> Callable[..., Any]:
    """``GradScaler._maybe_opt_step`` stepping whatever ``found_inf`` says: an overflow step moves
    the parameters (a for-loop or foreach optimizer's skip is this method's)."""

    def _maybe_opt_step(self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    return _maybe_opt_step


def _clip_by(params: list[Any], max_norm: float, norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_'s last part: every gradient times min(1, max_norm / (norm + 1e-6))."""
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef)
    return norm


def clip_grad_norm_in_bf16(original: Any) -> Any:
    """``clip_grad_norm_`` whose total norm is accumulated in bf16 (a lossy reduction): its
    coefficient, and so every clipped gradient, is off by up to bf16's rounding. It honours
    ``error_if_nonfinite``: the fault is the reduction's precision and nothing else."""

    def lossy(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        params = [p for p in parameters if p.grad is not None]
        norm: torch.Tensor = torch.stack([p.grad.to(torch.bfloat16).float().norm() for p in params]).norm()
        if kwargs.get("error_if_nonfinite") and not bool(norm.isfinite()):
            raise RuntimeError("The total norm is non-finite, so it cannot be clipped.")
        return _clip_by(params, max_norm, norm)

    return lossy


def clip_norm_sentinel(original: Any) -> Any:
    """``clip_grad_norm_`` that turns a non-finite total norm into a -1 sentinel (the bug
    DeepSpeed's bf16 gradient-norm guard pins): the coefficient max_norm / (-1 + eps) is negative
    and flips every gradient's sign; a finite norm is reported where the step overflowed."""

    def sentinel(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        params = [p for p in parameters if p.grad is not None]
        norm: torch.Tensor = torch.stack([p.grad.detach().float().norm() for p in params]).norm()
        if not bool(norm.isfinite()):
            if kwargs.get("error_if_nonfinite"):
                raise RuntimeError("The total norm is non-finite, so it cannot be clipped.")
            norm = torch.tensor(-1.0)
        return _clip_by(params, max_norm, norm)

    return sentinel


def clip_ignoring_error_if_nonfinite(original: Any) -> Any:
    """``clip_grad_norm_`` that drops ``error_if_nonfinite``: a non-finite norm is clipped (every
    gradient turned NaN) instead of raising."""

    def ignoring(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("error_if_nonfinite", None)
        out: torch.Tensor = original(parameters, max_norm, *args, **kwargs)
        return out

    return ignoring


def tensor_to_scale_doubled(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's ``tensor_to_scale`` returning twice its scale (a binade off: saturating casts)."""

    def tensor_to_scale(*args: Any, **kwargs: Any) -> torch.Tensor:
        return real(*args, **kwargs) * 2

    return tensor_to_scale


def to_mx_scale_binade_high(real: Callable[..., Any]) -> Callable[..., Any]:
    """torchao's MX ``to_mx`` storing every e8m0 block scale one code high (an exponent bias off by
    one) over elements quantised with the right one: every MX value decodes at twice its size."""

    def to_mx(*args: Any, **kwargs: Any) -> Any:
        scale, data = real(*args, **kwargs)
        return (scale.view(torch.uint8) + 1).view(scale.dtype), data

    return to_mx


def scaled_mm_without_scale_b(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch._scaled_mm`` that drops its second operand's scale (multiplies by 1 instead: a
    kernel reading the wrong scale pointer), so every output is off by that operand's scale."""

    def scaled_mm(a: torch.Tensor, b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs.get("scale_b") is not None:
            kwargs["scale_b"] = torch.ones_like(kwargs["scale_b"])
        return real(a, b, *args, **kwargs)

    return scaled_mm


def matmul_slowed_under_autocast(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.__matmul__`` running at half speed under autocast (a low-precision kernel that
    regressed): each call spins as long again as it computed, on this thread's CPU time (the clock
    a CPU speedup is judged by); outside autocast, fp32, it is untouched."""
    import time

    def matmul(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(self.device.type):
            return real(self, other)
        start = time.thread_time()
        out = real(self, other)
        end = time.thread_time() * 2 - start
        while time.thread_time() < end:
            pass
        return out

    return matmul


def autocast_disabled(real: Callable[..., None]) -> Callable[..., None]:
    """``torch.autocast`` that never enables itself (a release whose autocast silently does
    nothing): every region runs in fp32, and saves fp32 activations for backward."""

    def __init__(
        self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None
    ) -> None:
        real(self, device_type, dtype=dtype, enabled=False, cache_enabled=cache_enabled)

    return __init__


def adamw_amsgrad_by_default(real: Callable[..., None]) -> Callable[..., None]:
    """``AdamW`` built with ``amsgrad=True`` unless told otherwise (a changed default): a third
    fp32 buffer per parameter, ``max_exp_avg_sq``, in the optimizer state."""

    def __init__(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("amsgrad", True)
        real(self, params, *args, **kwargs)

    return __init__


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


def fp8_e4m3_cast_toward_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float8_e4m3fn cast rounds toward zero where it should round
    up in magnitude (a truncating conversion kernel); every other conversion is untouched."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype is torch.float8_e4m3fn:
            up = (real(out, torch.float32).abs() > self.abs()) & (real(out, torch.float32) != 0)
            out = out.clone()
            out.view(torch.uint8)[up] -= 1  # one code toward zero (sign and magnitude)
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


def fp8_overflow_to_nan(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float8 casts give NaN beyond the format's largest finite
    value, where torch saturates (e4m3fn) or gives inf (e5m2): a release changing its choice."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            beyond = self.abs() > float(torch.finfo(out.dtype).max)
            out = torch.where(beyond, real(torch.full_like(self, float("nan")), out.dtype), out)
        return out

    return to


def fp8_nan_to_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``Tensor.to`` whose float32 -> float8 casts turn NaN into zero."""

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = real(self, *args, **kwargs)
        if self.dtype is torch.float32 and out.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            out = torch.where(self.isnan(), real(torch.zeros_like(self), out.dtype), out)
        return out

    return to


def sr_round_to_nearest(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's fp32 -> bf16 stochastic rounding secretly rounding to nearest: every draw a
    neighbour, none of them random (a kernel whose random bits stay zero above one half)."""

    def sr(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16)

    return sr


def sr_unseeded(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's fp32 -> bf16 stochastic rounding drawing from a generator of its own, seeded
    from the operating system: unbiased and random, but a seed no longer replays it."""

    def sr(x: torch.Tensor) -> torch.Tensor:
        own = torch.Generator(device=x.device)
        own.seed()
        noise = torch.randint(0, 1 << 16, x.shape, device=x.device, dtype=torch.int32, generator=own)
        return ((x.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)  # torchao's rule

    return sr


def f4_cast_toward_zero(real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """torchao's float32 -> e2m1 (fp4) cast truncating: where the nearest code lies above the value
    in magnitude, the code one below (sign and magnitude: the low three bits minus one)."""
    decode = resolve("torchao.prototype.mx_formats.kernels.f4_unpacked_to_f32")

    def f32_to_f4_unpacked(x: torch.Tensor) -> torch.Tensor:
        out = real(x)
        above = decode(out).abs() > x.abs()
        return torch.where(above & ((out & 7) > 0), out - 1, out)

    return f32_to_f4_unpacked


class _Finfo:
    """``torch.finfo`` of one dtype with its ``max`` halved (a wrong limit table)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        return value / 2 if name == "max" else value


def finfo_fp16_max_halved(real: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.finfo`` whose float16 ``max`` is half the format's largest finite value."""

    def finfo(*args: Any) -> Any:
        info = real(*args)
        return _Finfo(info) if info.dtype == "float16" else info

    return finfo


def _compiled_returning(transform: Callable[[Any], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``torch.compile`` fault: compiled functions return ``transform`` of what they computed
    (eager is untouched)."""

    def factory(real: Callable[..., Any]) -> Callable[..., Any]:
        def compile(fn: Any = None, **kwargs: Any) -> Any:
            compiled = real(fn, **kwargs)
            return lambda *args, **kw: transform(compiled(*args, **kw))

        return compile

    return factory


def _softmax_to_4_bits(out: Any) -> Any:
    if isinstance(out, dict) and "softmax" in out:
        m, e = torch.frexp(out["softmax"].detach().float())
        out = {**out, "softmax": torch.ldexp(torch.round(m * 16) / 16, e).to(out["softmax"].dtype)}
    return out


#: ``torch.compile`` returning a ``softmax`` stage kept to 4 significand bits (a compiler losing
#: precision in one stage)
compile_rounding_softmax = _compiled_returning(_softmax_to_4_bits)


def _softmax_in_float32(out: Any) -> Any:
    return {**out, "softmax": out["softmax"].float()} if isinstance(out, dict) and "softmax" in out else out


#: ``torch.compile`` returning the ``softmax`` stage in float32 where eager gives it in the
#: low-precision dtype (a compiler dropping autocast's choice for one op)
compile_softmax_in_float32 = _compiled_returning(_softmax_in_float32)


def _tensor_in_float32(out: Any) -> Any:
    return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


#: ``torch.compile`` returning every floating tensor result in float32 (a compiler dropping
#: autocast's low-precision choice for every op compiled alone)
compile_outputs_in_float32 = _compiled_returning(_tensor_in_float32)


def _tensor_scaled_off(out: Any) -> Any:
    return out * (1 + 2**-4) if isinstance(out, torch.Tensor) and out.is_floating_point() else out


#: ``torch.compile`` returning a compiled model's output 1 + 2^-4 times what it computed (a constant
#: folded wrong in its 4th bit): compiled training drifts from eager (3.2x the MLP's parity
#: allowance; outputs merely rounded to 2 significand bits stay within it)
compile_output_scaled_off = _compiled_returning(_tensor_scaled_off)


def _region_out_in_low_precision(out: Any) -> Any:
    if isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        return out[0], out[1].to(out[0].dtype)
    return out


#: ``torch.compile`` whose functions returning ``(h, out)`` give ``out`` in ``h``'s low-precision
#: dtype (autocast leaking into a region that disabled it)
compile_region_in_low_precision = _compiled_returning(_region_out_in_low_precision)


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
    return _kernel("gelu", lossy_gelu(bits), "CPU")


def _kernel(op: str, kernel: Callable[..., Any], key: str) -> Any:
    """``kernel`` as ``op``'s kernel for dispatch ``key`` while the returned Library lives."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
        lib.impl(op, kernel, key)  # type: ignore[no-untyped-call]
    return lib


def _autocast_kernel(op: str, kernel: Callable[..., Any]) -> Any:
    """``kernel`` as ``op``'s AutocastCPU kernel while the returned Library lives: a fault below
    every Python API, where autocast itself decides (a captured call replays into it)."""
    return _kernel(op, kernel, "AutocastCPU")


def register_layer_norm_autocast_lowp() -> Any:
    """aten::layer_norm's autocast kernel casting to the low-precision dtype (autocast's fp32 list
    losing an op: a policy regression in the dispatcher, not in a Python wrapper)."""

    def layer_norm(
        x: Any, shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5, cudnn: bool = True
    ) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            w, b = (None if t is None else t.to(lp) for t in (weight, bias))
            return torch.ops.aten.layer_norm(x.to(lp), shape, w, b, eps, cudnn)

    return _autocast_kernel("layer_norm", layer_norm)


def register_mm_autocast_one_ulp_off() -> Any:
    """aten::mm's autocast kernel returning its first element one unit in the last place off:
    autocast's result is no longer the op run by hand on inputs cast to its choice."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            out = torch.ops.aten.mm(a.to(lp), b.to(lp)).clone()
        out.view(torch.int16).view(-1)[0] += 1
        return out

    return _autocast_kernel("mm", mm)


def register_lowp_gemm_twice_as_slow() -> Any:
    """aten::mm's CPU kernel taking twice its time on bfloat16 and float16 operands (each product
    computed twice through ``mm.out``), its result unchanged; float32 untouched: a low-precision
    GEMM kernel that regressed in speed only, below every Python API, autocast and the speed
    gate's contention probe (a low-precision matmul too) alike."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.mm.out(a, b, out=out)
        if a.dtype in (torch.bfloat16, torch.float16):
            torch.ops.aten.mm.out(a, b, out=out)
        return out

    return _kernel("mm", mm, "CPU")


def _gemm_kernels(post: Callable[[torch.Tensor], None]) -> Any:
    """aten::mm, addmm and bmm's CPU kernels with ``post`` applied to every bf16 result in place
    (a defective card's low-precision unit), other dtypes untouched, while the Library lives."""
    import warnings

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.mm.out(a, b, out=out)
        post(out)
        return out

    def addmm(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any = 1, alpha: Any = 1) -> Any:
        out = a.new_empty((a.shape[0], b.shape[1]))
        torch.ops.aten.addmm.out(c, a, b, beta=beta, alpha=alpha, out=out)
        post(out)
        return out

    def bmm(a: torch.Tensor, b: torch.Tensor) -> Any:
        out = a.new_empty((a.shape[0], a.shape[1], b.shape[2]))
        torch.ops.aten.bmm.out(a, b, out=out)
        post(out)
        return out

    lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, kernel in (("mm", mm), ("addmm", addmm), ("bmm", bmm)):
            lib.impl(op, kernel, "CPU")  # type: ignore[no-untyped-call]
    return lib


#: the stuck lane: one output column in every STUCK_EVERY of a bf16 GEMM
STUCK_EVERY = 64


def register_bf16_gemm_stuck_lane() -> Any:
    """A card whose bf16 GEMM unit has a stuck lane: the lowest mantissa bit of one output column in
    every 64 is forced to 1 (at most one ulp, every call): no tolerance sees it."""

    def stuck(out: torch.Tensor) -> None:
        if out.dtype == torch.bfloat16:
            out[..., ::STUCK_EVERY].view(torch.int16).bitwise_or_(1)

    return _gemm_kernels(stuck)


#: the intermittent fault's rate: one bf16 GEMM call in this many has one bit flipped
FLIP_EVERY = 300


def register_bf16_gemm_intermittent_flip(seed: int = 0, every: float = FLIP_EVERY) -> Any:
    """A card that flips one bit (the lowest of the mantissa) of one element of a bf16 GEMM's result
    in about one call of ``every``, at random (seeded): a transient fault."""
    import random

    rng = random.Random(seed)

    def flip(out: torch.Tensor) -> None:
        if out.dtype == torch.bfloat16 and out.numel() and rng.random() < 1 / every:
            out.view(-1)[rng.randrange(out.numel())].view(torch.int16).bitwise_xor_(1)

    return _gemm_kernels(flip)


def register_mm_autocast_casting_float64() -> Any:
    """aten::mm's autocast kernel casting every floating input, float64 too, to low precision."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.mm(a.to(lp), b.to(lp))

    return _autocast_kernel("mm", mm)


def register_mm_autocast_in_fp32() -> Any:
    """aten::mm's autocast kernel running in float32 (a lower-precision-list op left in fp32)."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.mm(a.float(), b.float())

    return _autocast_kernel("mm", mm)


def register_linear_autocast_uncached() -> Any:
    """aten::linear's autocast kernel casting its weight on every call (the cast cache lost)."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.linear(x.to(lp), w.to(lp), None if b is None else b.to(lp))

    return _autocast_kernel("linear", linear)


def register_gelu_autocast_kernel() -> Any:
    """An autocast kernel for aten::gelu, which has none (a release registering a new op)."""

    def gelu(x: torch.Tensor, approximate: str = "none") -> Any:
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.gelu(x, approximate=approximate)

    return _autocast_kernel("gelu", gelu)


#: name -> (the aten op whose kernel it replaces, what registers it: the Library it returns keeps it)
KERNELS: dict[str, tuple[str, Callable[[], Any]]] = {
    "lossy_gelu": ("gelu", register_lossy_gelu),
    "layer_norm_autocast_lowp": ("layer_norm", register_layer_norm_autocast_lowp),
    "mm_autocast_one_ulp_off": ("mm", register_mm_autocast_one_ulp_off),
    "mm_autocast_casting_float64": ("mm", register_mm_autocast_casting_float64),
    "lowp_gemm_twice_as_slow": ("mm", register_lowp_gemm_twice_as_slow),
    "bf16_gemm_stuck_lane": ("mm", register_bf16_gemm_stuck_lane),
    "bf16_gemm_intermittent_flip": ("mm", register_bf16_gemm_intermittent_flip),
    "mm_autocast_in_fp32": ("mm", register_mm_autocast_in_fp32),
    "linear_autocast_uncached": ("linear", register_linear_autocast_uncached),
    "gelu_autocast_registered": ("gelu", register_gelu_autocast_kernel),
}


def target(name: str) -> str:
    """What fault ``name`` replaces: two faults with one target cannot be installed together."""
    return f"aten::{KERNELS[name][0]}" if name in KERNELS else STACKS[name][0]


def with_kernel(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A patch factory: the patched function runs with the faulty kernel ``name`` in force, which
    is undone when it returns (an injected conftest scopes a kernel fault to the calls it patches)."""

    def factory(real: Callable[..., Any]) -> Callable[..., Any]:
        def faulty(*args: Any, **kwargs: Any) -> Any:
            lib = KERNELS[name][1]()
            try:
                return real(*args, **kwargs)
            finally:
                lib._destroy()

        return faulty

    return factory


def _update_keeping(scale: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A factory: a third-party scaler's update(found_inf) that keeps the attribute ``scale`` where
    an overflow lowers it."""

    def factory(real: Callable[..., None]) -> Callable[..., None]:
        def update(self: Any, found_inf: bool) -> None:
            before = getattr(self, scale)
            real(self, found_inf)
            if found_inf:
                setattr(self, scale, before)

        return update

    return factory


#: megatron-core's ``DynamicGradScaler.update`` and DeepSpeed's ``DynamicLossScaler.update_scale``
#: never backing off
megatron_update_never_backing_off = _update_keeping("_scale")
deepspeed_update_never_backing_off = _update_keeping("cur_scale")


#: name -> (patched attribute, factory): what ``installed`` and the injected conftests apply
STACKS: dict[str, tuple[str, str]] = {
    "megatron_scaler_never_backs_off": (
        "megatron.core.optimizer.grad_scaler.DynamicGradScaler.update",
        "faults.stacks.megatron_update_never_backing_off",
    ),
    "deepspeed_scaler_never_backs_off": (
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler.update_scale",
        "faults.stacks.deepspeed_update_never_backing_off",
    ),
    "layer_norm_in_low_precision": ("torch.nn.functional.layer_norm", "faults.autocast.layer_norm_in_low_precision"),
    "scaler_never_backs_off": ("torch.amp.GradScaler.update", "faults.stacks.update_never_backing_off"),
    "sgd_without_weight_decay": ("torch.optim.sgd.sgd", "faults.stacks.sgd_without_weight_decay"),
    "scaler_scaling_a_quarter_high": ("torch.amp.GradScaler.scale", "faults.stacks.scale_a_quarter_high"),
    "adamw_losing_fp32_update_precision": (
        "torch.optim.AdamW.step",
        "faults.training.adamw_losing_fp32_update_precision",
    ),
    "sgd_step_drifting_between_runs": (
        "torch.optim.SGD.step",
        "faults.training.optimizer_step_drifting_between_runs",
    ),
    "scaler_stepping_on_overflow": (
        "torch.amp.GradScaler._maybe_opt_step",
        "faults.stacks.scaler_stepping_on_overflow",
    ),
    "clip_grad_norm_in_bf16": ("torch.nn.utils.clip_grad_norm_", "faults.stacks.clip_grad_norm_in_bf16"),
    "clip_norm_sentinel": ("torch.nn.utils.clip_grad_norm_", "faults.stacks.clip_norm_sentinel"),
    "clip_ignoring_error_if_nonfinite": (
        "torch.nn.utils.clip_grad_norm_",
        "faults.stacks.clip_ignoring_error_if_nonfinite",
    ),
    "fp8_scale_doubled": ("torchao.float8.float8_utils.tensor_to_scale", "faults.stacks.tensor_to_scale_doubled"),
    # Float8Linear's casts take tensor_to_scale as float8_scaling_utils imported it
    "fp8_linear_scale_doubled": (
        "torchao.float8.float8_scaling_utils.tensor_to_scale",
        "faults.stacks.tensor_to_scale_doubled",
    ),
    "fp8_mx_scale_binade_high": (
        "torchao.prototype.mx_formats.mx_tensor.to_mx",
        "faults.stacks.to_mx_scale_binade_high",
    ),
    "fp8_scaled_mm_without_scale_b": ("torch._scaled_mm", "faults.stacks.scaled_mm_without_scale_b"),
    "matmul_slowed_under_autocast": ("torch.Tensor.__matmul__", "faults.stacks.matmul_slowed_under_autocast"),
    "autocast_disabled": ("torch.amp.autocast_mode.autocast.__init__", "faults.stacks.autocast_disabled"),
    "adamw_amsgrad_by_default": ("torch.optim.AdamW.__init__", "faults.stacks.adamw_amsgrad_by_default"),
    "fp16_cast_toward_zero": ("torch.Tensor.to", "faults.stacks.fp16_cast_toward_zero"),
    "fp8_overflow_to_nan": ("torch.Tensor.to", "faults.stacks.fp8_overflow_to_nan"),
    "fp8_decode_subnormals_flushed": ("torch.Tensor.to", "faults.stacks.fp8_decode_subnormals_flushed"),
    "fp8_e4m3_cast_toward_zero": ("torch.Tensor.to", "faults.stacks.fp8_e4m3_cast_toward_zero"),
    "fp8_e8m0_cast_rounding_down": ("torch.Tensor.to", "faults.stacks.e8m0_cast_rounding_down"),
    "fp8_nan_to_zero": ("torch.Tensor.to", "faults.stacks.fp8_nan_to_zero"),
    "finfo_fp16_max_halved": ("torch.finfo", "faults.stacks.finfo_fp16_max_halved"),
    "fp8_sr_round_to_nearest": ("torchao.optim.quant_utils._fp32_to_bf16_sr", "faults.stacks.sr_round_to_nearest"),
    "fp8_sr_unseeded": ("torchao.optim.quant_utils._fp32_to_bf16_sr", "faults.stacks.sr_unseeded"),
    "fp8_f4_cast_toward_zero": (
        "torchao.prototype.mx_formats.kernels.f32_to_f4_unpacked",
        "faults.stacks.f4_cast_toward_zero",
    ),
    # NVFP4's quantiser takes the same kernel as nvfp4_tensor imported it
    "fp8_nvfp4_elements_toward_zero": (
        "torchao.prototype.mx_formats.nvfp4_tensor.f32_to_f4_unpacked",
        "faults.stacks.f4_cast_toward_zero",
    ),
    "compile_rounding_softmax": ("torch.compile", "faults.stacks.compile_rounding_softmax"),
    "compile_softmax_in_float32": ("torch.compile", "faults.stacks.compile_softmax_in_float32"),
    "compile_region_in_low_precision": ("torch.compile", "faults.stacks.compile_region_in_low_precision"),
    "compile_outputs_in_float32": ("torch.compile", "faults.stacks.compile_outputs_in_float32"),
    "compile_output_scaled_off": ("torch.compile", "faults.stacks.compile_output_scaled_off"),
}


def resolve(dotted: str) -> Any:
    """The object ``dotted`` names. A module is the one ``from package import module`` gives: the
    package's attribute where it holds that module (after an in-process pytester run, sys.modules
    may have forgotten a submodule its package still holds, and the code under test uses the
    package's), else the module imported (one torch hides, torch.optim.sgd, too)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        parent, _, child = name.rpartition(".")
        held = getattr(sys.modules.get(parent), child, None) if parent else None
        if isinstance(held, types.ModuleType) and held.__name__ == name:
            obj: Any = held  # looked up before importing: an import would replace the package's attribute
        else:
            try:
                obj = importlib.import_module(name)
            except ImportError:
                continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@contextlib.contextmanager
def installed(name: str) -> Iterator[None]:
    """This interpreter's stack made the faulty one ``name`` (a patch of STACKS, or a kernel of
    KERNELS, whose registration lasts while its Library lives) for the body only, the real one
    restored after: faults that replace the same thing take turns in one interpreter."""
    if name in KERNELS:
        library = KERNELS[name][1]()
        try:
            yield
        finally:
            library._destroy()
        return
    target, factory = STACKS[name]
    owner_name, _, attr = target.rpartition(".")
    owner = resolve(owner_name)
    own = vars(owner).get(attr, _INHERITED)  # torch.Tensor.to lives on a base class
    setattr(owner, attr, resolve(factory)(resolve(target)))
    try:
        yield
    finally:
        if own is _INHERITED:
            delattr(owner, attr)
        else:
            setattr(owner, attr, own)


_INHERITED = object()
