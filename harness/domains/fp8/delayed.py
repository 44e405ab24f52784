"""Delayed scaling (an amax history per tensor) as a specification, a small implementation of it in
plain torch, and the adapter API a recipe implements to be checked against it.

Delayed scaling, as TransformerEngine's recipe defines it: each fp8-cast tensor keeps the amaxes of
its last ``history_len`` steps; the scale a step casts with comes from the history *before* that
step (``max`` of the window, or the ``most_recent`` entry), ``scale = fp8_max / amax / 2^margin``,
and the step's own amax enters the history after it. The rules the specification fixes, each a
place recipes have broken:

* the window rolls: entry ``history_len + 1`` steps old leaves it (a history that never rolls keeps
  an ancient amax and a stale scale forever);
* the margin divides once (``2^margin``; applied twice, every cast loses ``margin`` binades);
* a non-finite amax (an overflowed step) leaves history and scale as they were: one inf would
  otherwise hold the scale at 0 for ``history_len`` steps;
* an amax of 0 (a tensor of zeros) keeps the scale (``fp8_max / 0`` is no scale), and so does an
  amax so small that the scale is not a float32 (it would overflow to inf);
* ``state_dict`` / ``load_state_dict`` round-trips history and scale bit for bit.

The scale is float32: ``fp8_max / amax`` correctly rounded to float32 (exact rational arithmetic,
:func:`float32_scale`), then divided by ``2^margin`` (exact unless it underflows). :func:`conformance_machine` drives any :class:`DelayedScalingAdapter` through random
steps and round trips against :func:`reference_update`, as the loss-scaler suite does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, Protocol

import torch

from harness.numerics.formats import FP8_E4M3FN, FP32, FloatFormat

Algorithm = Literal["max", "most_recent"]


@dataclass(frozen=True)
class DelayedConfig:
    history_len: int
    algorithm: Algorithm = "max"
    margin: int = 0
    fmt: FloatFormat = FP8_E4M3FN


@dataclass(frozen=True)
class DelayedState:
    """The specification's state: the window (oldest first, at most ``history_len``) and the
    scale the next step casts with."""

    history: tuple[float, ...] = ()
    scale: float = 1.0


def float32_scale(fmt: FloatFormat, amax: float, margin: int) -> float:
    """``fmt.max / amax`` correctly rounded to float32 (exact rational arithmetic), divided by
    ``2^margin`` (exact while normal; float32's rounding below); inf where it overflows."""
    q = Fraction(fmt.max) / Fraction(amax)
    r = FP32.round_ratio(q.numerator, q.denominator)
    scale = math.inf if r.bits is None else FP32.decode(r.bits)
    return float(torch.tensor(math.ldexp(scale, -margin), dtype=torch.float32)) if math.isfinite(scale) else scale


def reference_update(cfg: DelayedConfig, state: DelayedState, amax: float) -> DelayedState:
    """The state after a step whose tensor had ``amax`` (the rules of the module docstring; the
    amax arrives as the float32 it is)."""
    a = float(torch.tensor(amax, dtype=torch.float32))
    if not math.isfinite(a):
        return state
    history = (*state.history, abs(a))[-cfg.history_len :]
    selected = max(history) if cfg.algorithm == "max" else history[-1]
    if selected <= 0:
        return DelayedState(history, state.scale)
    scale = float32_scale(cfg.fmt, selected, cfg.margin)
    return DelayedState(history, scale if math.isfinite(scale) else state.scale)


class DelayedScalingAdapter(Protocol):
    """What a delayed-scaling recipe implements to be checked (TransformerEngine's, yours)."""

    def scale(self) -> float:
        """The scale the next step casts with (float32)."""

    def update(self, amax: float) -> None:
        """After a step: its tensor's amax (fp32; may be inf or NaN)."""

    def history(self) -> list[float]:
        """The amaxes in the window, oldest first."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TorchDelayedScaling:
    """The specification in plain torch, as a recipe would write it: a float32 history buffer
    rolled each step, the scale a float32 tensor."""

    def __init__(self, cfg: DelayedConfig) -> None:
        self.cfg = cfg
        self._history = torch.zeros(cfg.history_len, dtype=torch.float32)
        self._filled = 0
        self._scale = torch.ones((), dtype=torch.float32)

    def scale(self) -> float:
        return float(self._scale)

    def update(self, amax: float) -> None:
        a = torch.tensor(amax, dtype=torch.float32).abs()
        if not bool(torch.isfinite(a)):
            return
        self._history = torch.roll(self._history, -1)
        self._history[-1] = a
        self._filled = min(self._filled + 1, self.cfg.history_len)
        window = self._history[-self._filled :]
        selected = window.max() if self.cfg.algorithm == "max" else window[-1]
        if float(selected) > 0:
            q = (self.cfg.fmt.max / selected.double()).float()  # one float64 division, rounded to float32
            if bool(torch.isfinite(q)):
                self._scale = q / 2.0**self.cfg.margin

    def history(self) -> list[float]:
        return [float(v) for v in self._history[-self._filled :]] if self._filled else []

    def state_dict(self) -> dict[str, Any]:
        return {"history": self._history.clone(), "filled": self._filled, "scale": self._scale.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history = state["history"].clone()
        self._filled = int(state["filled"])
        self._scale = state["scale"].clone()


Factory = Callable[[DelayedConfig], DelayedScalingAdapter]


def conformance_machine(factory: Factory, counts: Counter[str] | None = None) -> type:
    """A hypothesis state machine: random configurations, steps with amaxes across the format's
    range (zeros, subnormal-small, huge, inf, NaN) and state_dict round trips into a fresh
    instance; after every rule the adapter's scale and history must equal the specification's,
    bit for bit. ``counts`` tallies the rules run (so a check can require they were exercised)."""
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

    tally: Counter[str] = Counter() if counts is None else counts
    amaxes = st.one_of(
        st.floats(min_value=2.0**-100, max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32),
        st.sampled_from([0.0, 1.0, 448.0, 1e-38, 3.0e38, math.inf, -math.inf, math.nan]),
    )

    class DelayedScalingMachine(RuleBasedStateMachine):
        @initialize(
            history_len=st.integers(1, 16),
            algorithm=st.sampled_from(["max", "most_recent"]),
            margin=st.integers(0, 3),
        )
        def setup(self, history_len: int, algorithm: Algorithm, margin: int) -> None:
            self.cfg = DelayedConfig(history_len, algorithm, margin)
            self.impl = factory(self.cfg)
            self.ref = DelayedState()

        @rule(amax=amaxes)
        def step(self, amax: float) -> None:
            tally["step"] += 1
            tally["non_finite" if not math.isfinite(amax) else "finite"] += 1
            if len(self.ref.history) == self.cfg.history_len and math.isfinite(amax):
                tally["rolled"] += 1
            self.impl.update(amax)
            self.ref = reference_update(self.cfg, self.ref, amax)

        @rule()
        def round_trip(self) -> None:
            tally["round_trip"] += 1
            fresh = factory(self.cfg)
            fresh.load_state_dict(self.impl.state_dict())
            self.impl = fresh

        @invariant()
        def matches_the_specification(self) -> None:
            if not hasattr(self, "impl"):
                return
            got_scale, want_scale = self.impl.scale(), self.ref.scale
            got_history, want_history = (
                self.impl.history(),
                [float(torch.tensor(a, dtype=torch.float32)) for a in self.ref.history],
            )
            same_scale = got_scale == want_scale or (math.isnan(got_scale) and math.isnan(want_scale))
            assert same_scale and got_history == want_history, (
                f"{self.cfg}: scale {got_scale!r} (specification {want_scale!r}), history {got_history} "
                f"(specification {want_history})"
            )

    return DelayedScalingMachine
