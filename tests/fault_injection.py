"""Deliberately wrong implementations: each must make some check of the suites fail.

Each broken cast wraps torch's correct one and corrupts it the way a real bug would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hypothesis import Phase, settings
from torch.amp.grad_scaler import GradScaler, OptState

from harness.numerics.formats import FloatFormat, cast_bits, tensor_bits, torch_dtype

#: For runs that only need to show a check fails: the first counterexample, not the smallest.
settings.register_profile(
    "negative-control",
    max_examples=40,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


#: torch's own cast: what every broken cast below starts from.
correct = cast_bits


def truncating(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Round toward zero instead of to nearest (a cast that drops the low mantissa bits)."""
    out = []
    for x, b in zip(values, correct(values, fmt, device), strict=True):
        got = fmt.decode(b)
        if math.isfinite(x) and (abs(got) > abs(x)) and (b & ~fmt.sign_bit) != 0:
            b -= 1  # one step toward zero (same sign)
        out.append(b)
    return out


def ties_away_from_zero(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Round half away from zero (C's round()) instead of half to even."""
    out = []
    for x, b in zip(values, correct(values, fmt, device), strict=True):
        got = fmt.decode(b)
        if math.isfinite(got) and math.isfinite(x) and abs(got) < abs(x):
            up = fmt.decode(b + 1)
            if abs(up) - abs(x) == abs(x) - abs(got):  # an exact tie that went to even, downward
                b += 1
        out.append(b)
    return out


def flush_subnormals(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Flush-to-zero: subnormal results become signed zero (a DAZ/FTZ mode left on)."""
    mant_exp_mask = ~fmt.sign_bit & ((1 << fmt.total_bits) - 1)
    return [
        b & fmt.sign_bit if 0 < (b & mant_exp_mask) < (1 << fmt.mantissa_bits) else b
        for b in correct(values, fmt, device)
    ]


def saturating(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Clamp to +-max before casting: overflow gives max instead of inf."""
    clamped = [x if math.isnan(x) else max(-fmt.max, min(fmt.max, x)) for x in values]
    return correct(clamped, fmt, device)


def via_fp16(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Double rounding: fp32 -> fp16 -> target (wrong for bf16, whose range fp16 cannot hold)."""
    t = torch.tensor(list(values), dtype=torch.float32, device=device).half()
    return tensor_bits(t.to(torch_dtype(fmt)))


def nan_to_zero(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """A cast that sanitises NaN to zero (torch.nan_to_num slipped into the path)."""
    return correct([0.0 if math.isnan(x) else x for x in values], fmt, device)


def sign_flip_on_overflow(values: Sequence[float], fmt: FloatFormat, device: torch.device) -> list[int]:
    """Overflow wraps to the opposite sign's maximum (an integer-style wraparound): not monotonic."""
    max_bits = fmt.max_finite_bits
    out = []
    for x, b in zip(values, correct(values, fmt, device), strict=True):
        if math.isfinite(x) and abs(x) >= fmt.overflow_threshold:
            b = max_bits if x < 0 else fmt.sign_bit | max_bits
        out.append(b)
    return out


BROKEN_CASTS = {
    "sign_flip_on_overflow": sign_flip_on_overflow,
    "truncating": truncating,
    "ties_away_from_zero": ties_away_from_zero,
    "flush_subnormals": flush_subnormals,
    "saturating": saturating,
    "via_fp16": via_fp16,
    "nan_to_zero": nan_to_zero,
}


# -- autocast regressions: each patch acts only inside an autocast region ---------------------------
def _lowp() -> torch.dtype:
    return torch.get_autocast_dtype("cpu")


def layer_norm_in_low_precision(real):  # type: ignore[no-untyped-def]
    """An fp32-list op that runs in low precision under autocast (a policy regression)."""

    def layer_norm(x, shape, weight=None, bias=None, eps=1e-5):  # type: ignore[no-untyped-def]
        if torch.is_autocast_enabled("cpu"):
            lp = _lowp()
            with torch.autocast("cpu", enabled=False):
                cast = [None if t is None else t.to(lp) for t in (weight, bias)]
                return real(x.to(lp), shape, cast[0], cast[1], eps)
        return real(x, shape, weight, bias, eps)

    return layer_norm


def linear_skips_autocast(real):  # type: ignore[no-untyped-def]
    """A lower-precision-list op that silently stays in fp32 (a speed regression)."""

    def linear(x, w, b=None):  # type: ignore[no-untyped-def]
        with torch.autocast("cpu", enabled=False):
            return real(x.float(), w.float(), None if b is None else b.float())

    return linear


def mm_accumulates_in_low_precision(real):  # type: ignore[no-untyped-def]
    """A GEMM that accumulates in the low format instead of fp32 (a numerics regression)."""

    def mm(a, b):  # type: ignore[no-untyped-def]
        if not torch.is_autocast_enabled("cpu"):
            return real(a, b)
        lp = _lowp()
        with torch.autocast("cpu", enabled=False):
            a, b = a.to(lp), b.to(lp)
            acc = torch.zeros(a.shape[0], b.shape[1], dtype=lp)
            for i in range(a.shape[1]):
                acc = acc + torch.outer(a[:, i], b[i, :])
            return acc

    return mm


def cast_cache_cleared(real):  # type: ignore[no-untyped-def]
    """Autocast's weight cast cache dropped on every call: the weight is re-cast each time."""

    def linear(*args, **kwargs):  # type: ignore[no-untyped-def]
        torch.clear_autocast_cache()
        return real(*args, **kwargs)

    return linear


def float64_cast(real):  # type: ignore[no-untyped-def]
    """float64 inputs cast down under autocast (they must be left alone)."""

    def mm(a, b):  # type: ignore[no-untyped-def]
        if torch.is_autocast_enabled("cpu") and a.dtype == torch.float64:
            return real(a.to(_lowp()), b.to(_lowp()))
        return real(a, b)

    return mm


class AutocastIgnoringDisable(torch.autocast):
    """``autocast(enabled=False)`` that does not disable: nested fp32 regions stay low precision."""

    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):  # type: ignore[no-untyped-def]
        super().__init__(
            device_type, dtype=dtype or torch.get_autocast_dtype(device_type), enabled=True, cache_enabled=cache_enabled
        )


# -- loss-scaler bugs: GradScaler subclasses, each wrong in one way ----------------------------------


class PyGradScaler(GradScaler):
    """GradScaler with update() in Python (torch semantics), so single steps of it can be broken."""

    def _found_inf(self) -> bool:
        return bool(
            sum(
                float(v.item())
                for st in self._per_optimizer_states.values()
                for v in st["found_inf_per_device"].values()
            )
        )

    def _on_inf(self) -> None:
        self._scale.mul_(self._backoff_factor)  # type: ignore[union-attr]
        self._growth_tracker.fill_(0)  # type: ignore[union-attr]

    def _on_clean(self) -> None:
        tracker = int(self._growth_tracker.item()) + 1  # type: ignore[union-attr]
        if tracker == self._growth_interval:
            grown = self._scale * self._growth_factor  # type: ignore[operator]
            if torch.isfinite(grown):
                self._scale.copy_(grown)  # type: ignore[union-attr]
            tracker = 0
        self._growth_tracker.fill_(tracker)  # type: ignore[union-attr]

    def update(self, new_scale=None):  # type: ignore[no-untyped-def]
        if new_scale is not None:
            return super().update(new_scale)
        self._check_scale_growth_tracker("update")
        if self._found_inf():
            self._on_inf()
        else:
            self._on_clean()
        self._per_optimizer_states = type(self._per_optimizer_states)(self._per_optimizer_states.default_factory)
        return None


class NeverBacksOff(PyGradScaler):
    def _on_inf(self) -> None:
        self._growth_tracker.fill_(0)  # type: ignore[union-attr]


class TrackerNotResetOnInf(PyGradScaler):
    def _on_inf(self) -> None:
        self._scale.mul_(self._backoff_factor)  # type: ignore[union-attr]


class GrowsOneStepLate(PyGradScaler):
    def _on_clean(self) -> None:
        tracker = int(self._growth_tracker.item()) + 1  # type: ignore[union-attr]
        if tracker == self._growth_interval + 1:
            self._scale.mul_(self._growth_factor)  # type: ignore[union-attr]
            tracker = 0
        self._growth_tracker.fill_(tracker)  # type: ignore[union-attr]


class GrowthNotCapped(PyGradScaler):
    def _on_clean(self) -> None:
        tracker = int(self._growth_tracker.item()) + 1  # type: ignore[union-attr]
        if tracker == self._growth_interval:
            self._scale.mul_(self._growth_factor)  # type: ignore[union-attr]
            tracker = 0
        self._growth_tracker.fill_(tracker)  # type: ignore[union-attr]


class NewScaleResetsTracker(GradScaler):
    def update(self, new_scale=None):  # type: ignore[no-untyped-def]
        super().update(new_scale)
        if new_scale is not None:
            self._growth_tracker.fill_(0)  # type: ignore[union-attr]


class OnlyFirstOptimizerCounts(PyGradScaler):
    def _found_inf(self) -> bool:
        states = list(self._per_optimizer_states.values())
        return bool(sum(float(v.item()) for v in states[0]["found_inf_per_device"].values())) if states else False


class MissesNaN(GradScaler):
    """The inf check ignores NaN (it tests isinf only)."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):  # type: ignore[no-untyped-def]
        has_inf = any(
            bool(p.grad.isinf().any()) for g in optimizer.param_groups for p in g["params"] if p.grad is not None
        )
        out = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        for t in out.values():
            t.fill_(1.0 if has_inf else 0.0)
        return out


class StepsDespiteInf(GradScaler):
    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):  # type: ignore[no-untyped-def]
        return optimizer.step(*args, **kwargs)


class SkipBumpsOptimizerStep(GradScaler):
    """A skipped step still advances the optimizer's step counters (bias correction drifts)."""

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):  # type: ignore[no-untyped-def]
        if sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            for state in optimizer.state.values():
                if "step" in state:
                    state["step"] += 1
                if "momentum_buffer" in state and state["momentum_buffer"] is not None:
                    state["momentum_buffer"].mul_(0.9)
            return None
        return optimizer.step(*args, **kwargs)


class UnscalesTwice(GradScaler):
    """Divides the gradients by the scale twice."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):  # type: ignore[no-untyped-def]
        return super()._unscale_grads_(optimizer, inv_scale * inv_scale, found_inf, allow_fp16)


class AllowsDoubleUnscale(GradScaler):
    def unscale_(self, optimizer):  # type: ignore[no-untyped-def]
        if self._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED:
            return None
        return super().unscale_(optimizer)


class StateDictDropsTracker(GradScaler):
    def state_dict(self):  # type: ignore[no-untyped-def]
        sd = super().state_dict()
        sd["_growth_tracker"] = 0
        return sd


class BackoffFloorAtOne(PyGradScaler):
    """A 'safety' floor that is not torch's semantics: the scale never goes below 1."""

    def _on_inf(self) -> None:
        super()._on_inf()
        self._scale.clamp_(min=1.0)  # type: ignore[union-attr]


BROKEN_SCALERS = {
    c.__name__: c
    for c in (
        NeverBacksOff,
        TrackerNotResetOnInf,
        GrowsOneStepLate,
        GrowthNotCapped,
        NewScaleResetsTracker,
        OnlyFirstOptimizerCounts,
        MissesNaN,
        StepsDespiteInf,
        SkipBumpsOptimizerStep,
        UnscalesTwice,
        AllowsDoubleUnscale,
        StateDictDropsTracker,
        BackoffFloorAtOne,
    )
}


# -- training regressions -------------------------------------------------------------------------
def scaler_step_flushing_small_gradients(real, threshold: float = 1e-2):  # type: ignore[no-untyped-def]
    """GradScaler.step that silently flushes unscaled gradients below a threshold to zero."""

    def step(self, optimizer, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.unscale_(optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.masked_fill_(p.grad.abs() < threshold, 0.0)
        return real(self, optimizer, *args, **kwargs)

    return step


def autocast_linear_dropping_bias(real):  # type: ignore[no-untyped-def]
    """A fused low-precision GEMM kernel that ignores the bias under autocast."""

    def linear(x, w, b=None):  # type: ignore[no-untyped-def]
        return real(x, w, None if torch.is_autocast_enabled(x.device.type) else b)

    return linear


def scaler_silently_skipping_every_third_step(real):  # type: ignore[no-untyped-def]
    """GradScaler.step that drops every third optimizer step without backing off (undetectable
    as a skip from the scale)."""
    calls = {"n": 0}

    def step(self, optimizer, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            self.unscale_(optimizer)
            self._per_optimizer_states[id(optimizer)]["stage"] = OptState.STEPPED
            return None
        return real(self, optimizer, *args, **kwargs)

    return step


# -- distributed regressions (resolved by name inside the spawned ranks) ----------------------------
def _allreduce_into_bucket(bucket, compressed):  # type: ignore[no-untyped-def]
    """All-reduce a compressed copy of the bucket and copy the sum back into the bucket."""
    import torch.distributed as dist

    fut = dist.all_reduce(compressed, async_op=True).get_future()

    def decompress(f):  # type: ignore[no-untyped-def]
        out = bucket.buffer()
        out.copy_(f.value()[0])
        return out

    return fut.then(decompress)


def compress_hook_without_division(state, bucket):  # type: ignore[no-untyped-def]
    """fp16 compression that forgets to divide by the world size: gradients W times too large."""

    return _allreduce_into_bucket(bucket, bucket.buffer().to(torch.float16))


def compress_hook_losing_mantissa(state, bucket):  # type: ignore[no-untyped-def]
    """fp16 compression that rounds through bf16 first (3 mantissa bits lost before the all-reduce)."""
    import torch.distributed as dist

    return _allreduce_into_bucket(
        bucket, bucket.buffer().to(torch.bfloat16).to(torch.float16).div_(dist.get_world_size())
    )


class LocalInfScaler(GradScaler):
    """A sharded scaler that checks only its own shard and does not share the inf flag."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):  # type: ignore[no-untyped-def]
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    local = getattr(p.grad, "_local_tensor", p.grad)
                    local.mul_(inv_scale)
                    if not bool(torch.isfinite(local).all()):
                        found_inf.fill_(1.0)
        return {found_inf.device: found_inf}


def rank_crashes(rank: int, world: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    import torch.distributed as dist

    dist.barrier()  # rank 0 waits for a peer that is gone


def rank_hangs(rank: int, world: int) -> None:
    import time

    if rank == 1:
        time.sleep(3600)
