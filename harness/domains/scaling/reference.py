"""Dynamic loss scaling: an exact reference specification, an adapter protocol for scalers under
test, and reference implementations of the hysteresis variants used by large-model frameworks.

The specification is a pure function of (config, state, event) -> state, float32-faithful: the
scale is rounded to float32 after every multiply, as every implementation keeps it in a float32
tensor. Named semantics and their sources:

``torch``
    ``torch.amp.GradScaler`` / ``torch._amp_update_scale_``: on inf/NaN multiply by backoff and
    reset the growth tracker (no lower bound); otherwise count, and on exactly the
    ``growth_interval``-th consecutive clean update multiply by growth unless that overflows
    float32 (growth is capped at the largest finite float32) and reset the tracker.
    ``update(new_scale)`` sets the scale and leaves the tracker alone.
``megatron``
    Megatron-LM ``DynamicGradScaler``: an overflow resets the growth tracker and decrements the
    hysteresis tracker; only when it reaches 0 the scale backs off, never below ``min_scale``.
    Hysteresis is refilled only on growth.
``deepspeed``
    DeepSpeed ``DynamicLossScaler.update_scale``: growth when ``(iter - last_overflow_iter) %
    window == 0`` (the window-th clean step after the last overflow, counting the first window from
    iteration -1), hysteresis (``delayed_shift``) consumed by overflows and refilled on growth,
    backoff bounded by ``min_scale`` and an error when an overflow hits the minimum.
``apex``
    NVIDIA Apex ``amp.scaler.LossScaler``: halve on overflow (bounded by ``min_loss_scale`` when
    set), double after ``scale_window`` clean steps, never above ``max_loss_scale = 2^24``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, replace
from typing import Literal, Protocol

Semantics = Literal["torch", "megatron", "deepspeed", "apex"]
SEMANTICS: tuple[Semantics, ...] = ("torch", "megatron", "deepspeed", "apex")
FP32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


def f32(x: float) -> float:
    """Round to the nearest float32 (inf beyond its range), as a float32 tensor would hold it."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


class ScalerAtMinimumError(RuntimeError):
    """DeepSpeed semantics: an overflow with the scale already at its minimum."""


@dataclass(frozen=True)
class ScalerConfig:
    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    hysteresis: int = 1
    min_scale: float = 0.0
    max_scale: float = FP32_MAX
    raise_at_min_scale: bool = False


@dataclass(frozen=True)
class ScalerState:
    scale: float
    growth_tracker: int = 0
    hysteresis_left: int = 1
    iteration: int = 0
    last_overflow_iter: int = -1

    @staticmethod
    def initial(cfg: ScalerConfig) -> ScalerState:
        return ScalerState(scale=f32(cfg.init_scale), hysteresis_left=cfg.hysteresis)


def update(semantics: Semantics, cfg: ScalerConfig, s: ScalerState, found_inf: bool) -> ScalerState:
    """One ``update()`` at the end of an iteration."""
    if semantics == "torch":
        if found_inf:
            return replace(s, scale=f32(s.scale * cfg.backoff_factor), growth_tracker=0)
        tracker = s.growth_tracker + 1
        if tracker == cfg.growth_interval:
            grown = f32(s.scale * cfg.growth_factor)
            return replace(s, scale=grown if math.isfinite(grown) else s.scale, growth_tracker=0)
        return replace(s, growth_tracker=tracker)
    if semantics == "megatron":
        if found_inf:
            left = s.hysteresis_left - 1
            scale = max(f32(s.scale * cfg.backoff_factor), cfg.min_scale) if left <= 0 else s.scale
            return replace(s, scale=scale, growth_tracker=0, hysteresis_left=left)
        tracker = s.growth_tracker + 1
        if tracker == cfg.growth_interval:
            return replace(s, scale=f32(s.scale * cfg.growth_factor), growth_tracker=0, hysteresis_left=cfg.hysteresis)
        return replace(s, growth_tracker=tracker)
    if semantics == "deepspeed":
        it = s.iteration
        if found_inf:
            if cfg.hysteresis == 1 or s.hysteresis_left == 1:
                if s.scale == cfg.min_scale and cfg.raise_at_min_scale:
                    raise ScalerAtMinimumError("Current loss scale already at minimum - cannot decrease scale anymore.")
                s = replace(s, scale=max(f32(s.scale / cfg.growth_factor), cfg.min_scale))
            else:
                s = replace(s, hysteresis_left=s.hysteresis_left - 1)
            return replace(s, last_overflow_iter=it, iteration=it + 1)
        if (it - s.last_overflow_iter) % cfg.growth_interval == 0:
            s = replace(s, scale=f32(s.scale * cfg.growth_factor), hysteresis_left=cfg.hysteresis)
        return replace(s, iteration=it + 1)
    if semantics == "apex":
        if found_inf:
            scale = f32(s.scale / 2.0)
            return replace(s, scale=max(cfg.min_scale, scale) if cfg.min_scale else scale, growth_tracker=0)
        tracker = s.growth_tracker + 1
        if tracker == cfg.growth_interval:
            return replace(s, scale=min(cfg.max_scale, f32(s.scale * 2.0)), growth_tracker=0)
        return replace(s, growth_tracker=tracker)
    raise ValueError(f"unknown scaler semantics {semantics!r}; known: {', '.join(SEMANTICS)}")


def set_scale(s: ScalerState, new_scale: float) -> ScalerState:
    """``update(new_scale)`` (torch): the scale is replaced, the growth tracker kept."""
    return replace(s, scale=f32(new_scale))


def steps_to_zero(cfg: ScalerConfig) -> int:
    """How many consecutive overflows take the torch scale from init to 0.0 (it has no floor)."""
    s, n = ScalerState.initial(cfg), 0
    while s.scale > 0:
        s, n = update("torch", cfg, s, True), n + 1
    return n


# -- adapters: run the state machine against any scaler --------------------------------------
class ScalerAdapter(Protocol):
    """What the conformance machine needs from a scaler: feed it an iteration, read its state."""

    semantics: Semantics

    def update(self, found_inf: bool) -> None: ...

    def scale(self) -> float: ...

    def growth_tracker(self) -> int | None:
        """The clean-step counter, or None where the scaler has none to compare."""
        ...


# Reference implementations written the way their frameworks write them (mutable objects,
# their own names), independent of the functional specification above.
class MegatronStyleScaler:
    def __init__(
        self,
        initial_scale: float,
        min_scale: float,
        growth_factor: float,
        backoff_factor: float,
        growth_interval: int,
        hysteresis: int,
    ) -> None:
        self._scale = f32(initial_scale)
        self.min_scale, self.growth_factor, self.backoff_factor = min_scale, growth_factor, backoff_factor
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self._growth_tracker, self._hysteresis_tracker = 0, hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = max(f32(self._scale * self.backoff_factor), self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = f32(self._scale * self.growth_factor)


class DeepSpeedStyleScaler:
    def __init__(
        self,
        init_scale: float,
        scale_factor: float,
        scale_window: int,
        min_scale: float,
        delayed_shift: int,
        raise_error_at_min_scale: bool = True,
    ) -> None:
        self.cur_scale, self.cur_iter, self.last_overflow_iter = f32(init_scale), 0, -1
        self.scale_factor, self.scale_window, self.min_scale = scale_factor, scale_window, min_scale
        self.delayed_shift = self.cur_hysteresis = delayed_shift
        self.raise_error_at_min_scale = raise_error_at_min_scale

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
                    raise ScalerAtMinimumError("Current loss scale already at minimum - cannot decrease scale anymore.")
                self.cur_scale = max(f32(self.cur_scale / self.scale_factor), self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.cur_hysteresis = self.delayed_shift
                self.cur_scale = f32(self.cur_scale * self.scale_factor)
        self.cur_iter += 1


class ApexStyleScaler:
    def __init__(
        self,
        loss_scale: float = 2.0**16,
        scale_window: int = 2000,
        min_loss_scale: float | None = None,
        max_loss_scale: float = 2.0**24,
    ) -> None:
        self._loss_scale, self._scale_seq_len = f32(loss_scale), scale_window
        self._min_loss_scale, self._max_loss_scale, self._unskipped = min_loss_scale, max_loss_scale, 0

    def update_scale(self, has_overflow: bool) -> None:
        if has_overflow:
            half = f32(self._loss_scale / 2.0)
            self._loss_scale = max(self._min_loss_scale, half) if self._min_loss_scale else half
            self._unskipped = 0
        else:
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len:
            self._loss_scale = min(self._max_loss_scale, f32(self._loss_scale * 2.0))
            self._unskipped = 0


@dataclass
class MegatronAdapter:
    impl: MegatronStyleScaler
    semantics: Semantics = "megatron"

    def update(self, found_inf: bool) -> None:
        self.impl.update(found_inf)

    def scale(self) -> float:
        return self.impl._scale

    def growth_tracker(self) -> int | None:
        return self.impl._growth_tracker


@dataclass
class DeepSpeedAdapter:
    impl: DeepSpeedStyleScaler
    semantics: Semantics = "deepspeed"

    def update(self, found_inf: bool) -> None:
        self.impl.update_scale(found_inf)

    def scale(self) -> float:
        return self.impl.cur_scale

    def growth_tracker(self) -> int | None:
        return None  # DeepSpeed counts iterations, not clean steps


@dataclass
class ApexAdapter:
    impl: ApexStyleScaler
    semantics: Semantics = "apex"

    def update(self, found_inf: bool) -> None:
        self.impl.update_scale(found_inf)

    def scale(self) -> float:
        return self.impl._loss_scale

    def growth_tracker(self) -> int | None:
        return self.impl._unskipped


def reference_adapter(semantics: Semantics, cfg: ScalerConfig) -> ScalerAdapter:
    """The shipped reference implementation of a semantics, wrapped for the conformance machine."""
    if semantics == "megatron":
        return MegatronAdapter(
            MegatronStyleScaler(
                cfg.init_scale,
                cfg.min_scale,
                cfg.growth_factor,
                cfg.backoff_factor,
                cfg.growth_interval,
                cfg.hysteresis,
            )
        )
    if semantics == "deepspeed":
        return DeepSpeedAdapter(
            DeepSpeedStyleScaler(
                cfg.init_scale,
                cfg.growth_factor,
                cfg.growth_interval,
                cfg.min_scale,
                cfg.hysteresis,
                cfg.raise_at_min_scale,
            )
        )
    if semantics == "apex":
        return ApexAdapter(ApexStyleScaler(cfg.init_scale, cfg.growth_interval, cfg.min_scale or None, cfg.max_scale))
    raise ValueError(f"no reference implementation for {semantics!r} (torch's is torch.amp.GradScaler itself)")


# -- known behaviour differences between torch releases ----------------------------------------
@dataclass(frozen=True)
class KnownIssue:
    id: str
    summary: str
    #: torch minor versions (e.g. "2.13") where the behaviour was observed
    affected: tuple[str, ...]
    reference: str


KNOWN_ISSUES: dict[str, KnownIssue] = {
    "update-int-new-scale": KnownIssue(
        "update-int-new-scale",
        "GradScaler.update(new_scale) accepts a float or a tensor; a Python int falls into the tensor branch and "
        "raises AttributeError ('int' object has no attribute 'device')",
        affected=("2.13",),
        reference="torch/amp/grad_scaler.py: update(): isinstance(new_scale, float) else tensor checks",
    ),
    "update-before-scale-after-load": KnownIssue(
        "update-before-scale-after-load",
        "a GradScaler restored with load_state_dict() creates its scale tensor lazily at the next scale(); "
        "update(new_scale) before that raises AssertionError ('_scale is None')",
        affected=("2.13",),
        reference="torch/amp/grad_scaler.py: _check_scale_growth_tracker() in update()",
    ),
}
