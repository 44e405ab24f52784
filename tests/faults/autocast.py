"""Autocast regressions: each patch acts only inside an autocast region, on whatever device the
tensors it gets live on (the device type is read from the inputs, never assumed)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from faults import fixed_in_this_release
from faults.stacks import autocast_kernel

Fn = Callable[..., torch.Tensor]


def _lowp(device_type: str) -> torch.dtype:
    return torch.get_autocast_dtype(device_type)


def layer_norm_in_low_precision(real: Fn) -> Fn:
    """An fp32-list op that runs in low precision under autocast (a policy regression)."""

    def layer_norm(
        x: torch.Tensor,
        shape: Any,
        weight: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        eps: float = 1e-5,
    ) -> torch.Tensor:
        dev = x.device.type
        if torch.is_autocast_enabled(dev):
            lp = _lowp(dev)
            with torch.autocast(dev, enabled=False):
                w, b = (None if t is None else t.to(lp) for t in (weight, bias))
                return real(x.to(lp), shape, w, b, eps)
        return real(x, shape, weight, bias, eps)

    return layer_norm


def linear_skips_autocast(real: Fn) -> Fn:
    """A lower-precision-list op that silently stays in fp32 (a speed regression)."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            return real(x.float(), w.float(), None if b is None else b.float())

    return linear


def mm_accumulates_in_low_precision(real: Fn) -> Fn:
    """A GEMM that accumulates in the low format instead of fp32 (a numerics regression)."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dev = a.device.type
        if not torch.is_autocast_enabled(dev):
            return real(a, b)
        lp = _lowp(dev)
        with torch.autocast(dev, enabled=False):
            a, b = a.to(lp), b.to(lp)
            acc = torch.zeros(a.shape[0], b.shape[1], dtype=lp, device=a.device)
            for i in range(a.shape[1]):
                acc = acc + torch.outer(a[:, i], b[i, :])
            return acc

    return mm


def cast_cache_cleared(real: Fn) -> Fn:
    """Autocast's weight cast cache dropped on every call: the weight is re-cast each time."""

    def linear(*args: Any, **kwargs: Any) -> torch.Tensor:
        torch.clear_autocast_cache()
        return real(*args, **kwargs)

    return linear


def linear_reusing_grad_free_casts(real: Fn) -> Fn:
    """Autocast's weight cache as torch 2.4 to 2.10 kept it (pytorch/pytorch#142234): a weight's
    low-precision cast made without autograd (under no_grad) is reused by a later training pass
    while the weight is unchanged, so that pass's weights drop off the graph."""
    import weakref

    #: id(weight) -> (the weight, weakly; its version when cast; the cast)
    cache: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}

    def cast(t: torch.Tensor, low: torch.dtype) -> torch.Tensor:
        hit = cache.get(id(t))
        if hit is None or hit[0]() is not t or hit[1] != t._version:
            hit = (weakref.ref(t), t._version, t.to(low))
            cache[id(t)] = hit
        return hit[2]

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        dev = x.device.type
        if not (torch.is_autocast_enabled(dev) and w.dtype == torch.float32 and w.requires_grad):
            return real(x, w, b)
        low = _lowp(dev)
        with torch.autocast(dev, enabled=False):
            return real(x.to(low), cast(w, low), None if b is None else cast(b, low))

    return linear


def float64_cast(real: Fn) -> Fn:
    """float64 inputs cast down under autocast (they must be left alone)."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dev = a.device.type
        if torch.is_autocast_enabled(dev) and a.dtype == torch.float64:
            return real(a.to(_lowp(dev)), b.to(_lowp(dev)))
        return real(a, b)

    return mm


class AutocastIgnoringDisable(torch.autocast):
    """``autocast(enabled=False)`` that does not disable: nested fp32 regions stay low precision."""

    def __init__(
        self,
        device_type: str,
        dtype: torch.dtype | None = None,
        enabled: bool = True,
        cache_enabled: bool | None = None,
    ) -> None:
        super().__init__(
            device_type, dtype=dtype or torch.get_autocast_dtype(device_type), enabled=True, cache_enabled=cache_enabled
        )


def autocast_ignoring_disable(real: type[torch.autocast]) -> type[torch.autocast]:
    """The patch form of :class:`AutocastIgnoringDisable` (replaces ``torch.autocast``)."""
    return AutocastIgnoringDisable


def _registering(case: str, summary: str) -> Callable[[dict[Any, Any]], dict[Any, Any]]:
    def factory(real: dict[Any, Any]) -> dict[Any, Any]:
        from harness.domains.autocast.oracle import KnownDisagreement

        minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
        return {**real, ("cpu", case): KnownDisagreement((minor,), ("bfloat16", "float16"), summary)}

    return factory


#: A registry entry for a disagreement that does not occur (a finding a release fixed, left behind).
registry_with_a_stale_finding = _registering("torch.mm", "claimed: mm runs in fp32 (it does not)")
#: A registry entry for the disagreement an op moved between the lists causes (F.mse_loss).
registry_with_the_mse_loss_finding = _registering("F.mse_loss", "registered on purpose by a negative control")


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

    return autocast_kernel("layer_norm", layer_norm)


def register_mm_autocast_one_ulp_off() -> Any:
    """aten::mm's autocast kernel returning its first element one unit in the last place off:
    autocast's result is no longer the op run by hand on inputs cast to its choice."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            out = torch.ops.aten.mm(a.to(lp), b.to(lp)).clone()
        out.view(torch.int16).view(-1)[0] += 1
        return out

    return autocast_kernel("mm", mm)


def register_mm_autocast_casting_float64() -> Any:
    """aten::mm's autocast kernel casting every floating input, float64 too, to low precision."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.mm(a.to(lp), b.to(lp))

    return autocast_kernel("mm", mm)


def register_mm_autocast_in_fp32() -> Any:
    """aten::mm's autocast kernel running in float32 (a lower-precision-list op left in fp32)."""

    def mm(a: torch.Tensor, b: torch.Tensor) -> Any:
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.mm(a.float(), b.float())

    return autocast_kernel("mm", mm)


def register_linear_autocast_uncached() -> Any:
    """aten::linear's autocast kernel casting its weight on every call (the cast cache lost)."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> Any:
        lp = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.linear(x.to(lp), w.to(lp), None if b is None else b.to(lp))

    return autocast_kernel("linear", linear)


def register_gelu_autocast_kernel() -> Any:
    """An autocast kernel for aten::gelu, which has none (a release registering a new op)."""

    def gelu(x: torch.Tensor, approximate: str = "none") -> Any:
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten.gelu(x, approximate=approximate)

    return autocast_kernel("gelu", gelu)


def register_addmm_activation_autocast_uncast() -> Any:
    """aten::_addmm_activation's AutocastCPU kernel passing its operands through uncast, as torch 2.4
    and 2.5 had no CPU autocast entry for it (pytorch/pytorch#132613): inside the encoder layer's fused
    fast path, whose attention autocast does cast, it meets a low-precision activation and fp32
    weights and raises."""

    def addmm_activation(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> Any:
        with torch.autocast("cpu", enabled=False):
            return torch.ops.aten._addmm_activation(bias, a, b, **kw)

    return autocast_kernel("_addmm_activation", addmm_activation)


def vmap_bias_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The autocast registry saying the vmapped bias's fp32 was fixed in the running release: on a
    release that still has it (2.4 to 2.15) the vmap check judges it, as it would without the entry."""
    from harness.domains.autocast.known_issues import VMAP_BIAS

    return fixed_in_this_release(original, VMAP_BIAS)


def attention_zeroing_non_finite(original: Any) -> Any:
    """``F.scaled_dot_product_attention`` whose outputs have every inf and NaN replaced by zero: a
    kernel that hides an overflow from the loss (what the CPU kernels of some releases do)."""

    def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> torch.Tensor:
        out: torch.Tensor = original(*args, **kwargs)
        return torch.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)

    return scaled_dot_product_attention


def attention_issues_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The autocast registry saying both attention issues were fixed in the running release: on a
    release that has them the attention check judges them, as it would without the entries."""
    from harness.domains.autocast.known_issues import SDPA_INF, SDPA_NAN

    return fixed_in_this_release(original, SDPA_INF, SDPA_NAN)


def nested_dtype_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The autocast registry saying nested regions' stale casts were fixed in the running release: on
    a release that still has them the nested-region check judges them, as it would without the entry."""
    from harness.domains.autocast.known_issues import NESTED_DTYPE

    return fixed_in_this_release(original, NESTED_DTYPE)


def nested_region_keeps_outer_dtype(real: type) -> type:
    """``torch.autocast`` whose region nested in an enabled one keeps the outer region's dtype,
    whatever dtype it asks for: a release whose nested regions never switch precision."""

    class autocast(real):  # type: ignore[misc]
        def __init__(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True, **kw: Any) -> None:
            if enabled and torch.is_autocast_enabled(device_type):
                dtype = torch.get_autocast_dtype(device_type)
            super().__init__(device_type, dtype=dtype, enabled=enabled, **kw)

    return autocast


def stale_casts_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The autocast registry saying casts stale after an in-place update were fixed in the running
    release: on a release that still serves them the in-place-update check judges them."""
    from harness.domains.autocast.known_issues import STALE_CASTS

    return fixed_in_this_release(original, STALE_CASTS)


def region_exit_keeps_casts(real: Callable[[], None]) -> Callable[[], None]:
    """``torch.clear_autocast_cache`` doing nothing: a release whose autocast regions no longer drop
    their casts on exit, so the next region computes with the weights of the last."""

    def clear_autocast_cache() -> None:
        return None

    return clear_autocast_cache


#: the key block of the fault below: whole blocks of masked keys are what the 2.4.0 kernel met
MASKED_KEY_BLOCK = 64


def attention_nan_for_masked_key_blocks(original: Any) -> Any:
    """``F.scaled_dot_product_attention`` whose rows that meet a whole block of masked keys come out
    NaN, every query still seeing others: the mechanism of torch 2.4.0's CPU flash kernel (its lazy
    softmax's ``exp(-inf - (-inf))``, pytorch/pytorch#127055), more broadly (that kernel spared a
    masked block at the start of the keys), on a release that no longer has it."""

    def scaled_dot_product_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None, *a: Any, **kw: Any
    ) -> torch.Tensor:
        out: torch.Tensor = original(q, k, v, attn_mask, *a, **kw)
        if attn_mask is None or attn_mask.dtype == torch.bool:
            return out
        n = attn_mask.shape[-1] - attn_mask.shape[-1] % MASKED_KEY_BLOCK
        blocks = attn_mask[..., :n].unflatten(-1, (-1, MASKED_KEY_BLOCK))  # type: ignore[no-untyped-call]
        meets = (blocks == -math.inf).all(-1).any(-1)
        return out.masked_fill(meets[..., None], math.nan)

    return scaled_dot_product_attention
