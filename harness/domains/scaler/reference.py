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
``deepspeed<=0.17.0``
    DeepSpeed ``DynamicLossScaler.update_scale`` up to 0.17.0: growth by ``scale_factor`` when
    ``(iter - last_overflow_iter) % window == 0`` (the window-th clean step after the last overflow,
    counting the first window from iteration -1), hysteresis (``delayed_shift``) consumed by
    overflows and refilled on growth, backoff by ``1 / scale_factor`` bounded by ``min_scale`` and
    an error when an overflow hits the minimum. The scale is a Python float (float64), not float32.
``deepspeed>=0.17.1``
    The same from 0.17.1 (deepspeedai/DeepSpeed#6976, "Improve overflow handling in ZeRO"): growth
    when ``stable = iter - last_overflow_iter - 1`` is positive and ``stable % window == 0``, one
    clean step later than before; ``scale_factor`` is no longer a constructor argument (fixed at 2).
``apex``
    NVIDIA Apex ``amp.scaler.LossScaler``: halve on overflow (bounded by ``min_loss_scale`` when
    set), double after ``scale_window`` clean steps, never above ``max_loss_scale = 2^24``.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from harness.domains.versions import release

Semantics = Literal["torch", "megatron", "deepspeed<=0.17.0", "deepspeed>=0.17.1", "apex"]
SEMANTICS: tuple[Semantics, ...] = ("torch", "megatron", "deepspeed<=0.17.0", "deepspeed>=0.17.1", "apex")
FP32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


def f32(x: float) -> float:
    """Round to the nearest float32 (inf beyond its range), as a float32 tensor would hold it."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


class ScalerAtMinimumError(RuntimeError):
    """DeepSpeed semantics: an overflow with the scale already at its minimum.

    An adapter whose scaler signals this another way (DeepSpeed raises a plain ``Exception``)
    translates it into this error; any other exception from a scaler is a conformance failure.
    """


class Diverged(enum.Enum):
    """What of a scaler's behaviour differed from its specification."""

    #: the scale or the growth tracker after an update
    STATE = "state"
    #: the at-minimum error raised by one and not the other
    AT_MINIMUM = "at_minimum"
    #: a step skipped on an overflow that still changed parameters or optimizer state
    SKIPPED_STEP = "skipped_step"


class Divergence(AssertionError):
    """A scaler unlike its specification, typed by ``what`` differed: a caller (the scripts of a
    failed check) decides on the type, never on the message's words."""

    def __init__(self, what: Diverged, message: str) -> None:
        super().__init__(message)
        self.what = what


def divergence_in(error: BaseException) -> Divergence | None:
    """The :class:`Divergence` ``error`` is or holds (hypothesis reports distinct failures of one
    run as an exception group), else None."""
    if isinstance(error, Divergence):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = divergence_in(inner)
        if found is not None:
            return found
    return None


class ConfigurationDeclined(Exception):
    """Raised by an adapter factory for a configuration its scaler refuses by design (megatron-core
    asserts ``min_scale > 0``; DeepSpeed from 0.17.1 has no growth factor but 2). The conformance
    machine discards that example and draws another; it is never a conformance failure."""


@dataclass(frozen=True)
class SemanticsSource:
    """Where a semantics comes from: the framework, the releases it holds for, and the code."""

    framework: str
    #: first and last release the rule holds for (inclusive; None: open-ended)
    first: str | None
    last: str | None
    source: str


SOURCES: dict[Semantics, SemanticsSource] = {
    "torch": SemanticsSource(
        "torch", None, None, "aten/src/ATen/native/cuda/AmpKernels.cu: _amp_update_scale_cuda_kernel"
    ),
    "megatron": SemanticsSource(
        "megatron-core",
        None,
        None,
        "megatron/core/optimizer/grad_scaler.py: DynamicGradScaler.update (checked: 0.16.1)",
    ),
    "deepspeed<=0.17.0": SemanticsSource(
        "deepspeed", None, "0.17.0", "deepspeed/runtime/fp16/loss_scaler.py: DynamicLossScaler.update_scale (0.17.0)"
    ),
    "deepspeed>=0.17.1": SemanticsSource(
        "deepspeed",
        "0.17.1",
        None,
        "deepspeed/runtime/fp16/loss_scaler.py: DynamicLossScaler.update_scale after deepspeedai/DeepSpeed#6976 "
        "(checked: 0.19.8)",
    ),
    "apex": SemanticsSource("apex", None, None, "apex/amp/scaler.py: LossScaler.update_scale"),
}


def semantics_for(framework: str, version: str) -> Semantics:
    """The semantics of ``framework`` at release ``version`` (e.g. ``("deepspeed", "0.19.8")``)."""
    known = sorted({src.framework for src in SOURCES.values()})
    if framework not in known:
        raise ValueError(f"no scaler semantics for framework {framework!r}; known: {', '.join(known)}")
    v = release(version)
    for name, src in SOURCES.items():
        if src.framework != framework:
            continue
        if (src.first is None or v >= release(src.first)) and (src.last is None or v <= release(src.last)):
            return name
    raise ValueError(f"{framework} {version}: no semantics covers this release ({', '.join(SEMANTICS)})")


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
    #: torch semantics: a growth that would overflow float32 is skipped
    cap_growth: bool = True


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


#: ``ScalerConfig.cap_growth=False`` models a scaler whose growth is not capped at the largest
#: float32 (the scale becomes inf and stays there: inf x backoff = inf). Only a registered known
#: issue may use it (ShardedGradScaler's CPU update, see known_issues.KNOWN_ISSUES).


def update(semantics: Semantics, cfg: ScalerConfig, s: ScalerState, found_inf: bool) -> ScalerState:
    """One ``update()`` at the end of an iteration."""
    if semantics == "torch":
        if found_inf:
            return replace(s, scale=f32(s.scale * cfg.backoff_factor), growth_tracker=0)
        tracker = s.growth_tracker + 1
        if tracker == cfg.growth_interval:
            grown = f32(s.scale * cfg.growth_factor)
            capped = grown if math.isfinite(grown) or not cfg.cap_growth else s.scale
            return replace(s, scale=capped, growth_tracker=0)
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
    if semantics in ("deepspeed<=0.17.0", "deepspeed>=0.17.1"):
        # a Python float: no float32 rounding, and no float32 overflow
        it = s.iteration
        if found_inf:
            if cfg.hysteresis == 1 or s.hysteresis_left == 1:
                if s.scale == cfg.min_scale and cfg.raise_at_min_scale:
                    raise ScalerAtMinimumError("Current loss scale already at minimum - cannot decrease scale anymore.")
                s = replace(s, scale=max(s.scale / cfg.growth_factor, cfg.min_scale))
            else:
                s = replace(s, hysteresis_left=s.hysteresis_left - 1)
            return replace(s, last_overflow_iter=it, iteration=it + 1)
        since = it - s.last_overflow_iter
        stable = since if semantics == "deepspeed<=0.17.0" else since - 1
        if stable > 0 and stable % cfg.growth_interval == 0:
            s = replace(s, scale=s.scale * cfg.growth_factor, hysteresis_left=cfg.hysteresis)
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
    """DeepSpeed up to 0.17.0 (``scale_factor`` configurable; a Python-float scale)."""

    def __init__(
        self,
        init_scale: float,
        scale_factor: float,
        scale_window: int,
        min_scale: float,
        delayed_shift: int,
        raise_error_at_min_scale: bool = True,
    ) -> None:
        self.cur_scale, self.cur_iter, self.last_overflow_iter = float(init_scale), 0, -1
        self.scale_factor, self.scale_window, self.min_scale = scale_factor, scale_window, min_scale
        self.delayed_shift = self.cur_hysteresis = delayed_shift
        self.raise_error_at_min_scale = raise_error_at_min_scale

    def _grows(self) -> bool:
        return (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
                    raise ScalerAtMinimumError("Current loss scale already at minimum - cannot decrease scale anymore.")
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        elif self._grows():
            self.cur_hysteresis = self.delayed_shift
            self.cur_scale *= self.scale_factor
        self.cur_iter += 1


class DeepSpeed0171StyleScaler(DeepSpeedStyleScaler):
    """DeepSpeed from 0.17.1: the window counts from the step after the last overflow."""

    def _grows(self) -> bool:
        stable_interval = self.cur_iter - self.last_overflow_iter - 1
        return stable_interval > 0 and stable_interval % self.scale_window == 0


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
    semantics: Semantics = "deepspeed>=0.17.1"

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
    if semantics in ("deepspeed<=0.17.0", "deepspeed>=0.17.1"):
        style = DeepSpeedStyleScaler if semantics == "deepspeed<=0.17.0" else DeepSpeed0171StyleScaler
        return DeepSpeedAdapter(
            style(
                cfg.init_scale,
                cfg.growth_factor,
                cfg.growth_interval,
                cfg.min_scale,
                cfg.hysteresis,
                cfg.raise_at_min_scale,
            ),
            semantics,
        )
    if semantics == "apex":
        return ApexAdapter(ApexStyleScaler(cfg.init_scale, cfg.growth_interval, cfg.min_scale or None, cfg.max_scale))
    raise ValueError(f"no reference implementation for {semantics!r} (torch's is torch.amp.GradScaler itself)")
