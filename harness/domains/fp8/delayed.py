"""Delayed scaling (an amax history per tensor) as a specification, a small implementation of it in
plain torch, and the adapter API a recipe implements to be checked against it.

Delayed scaling, as TransformerEngine's ``DelayedScaling`` recipe defines it
(``transformer_engine/pytorch/quantization.py``: ``_update_amax_history`` and
``_default_sf_compute``; ``common/recipe/delayed_scaling.cu``: the fused update): each fp8-cast
tensor's window holds the amaxes of its last ``history_len`` steps: after a step its amax enters
(the oldest leaves), the amax the scale comes from is the window's ``max`` or its ``most_recent``
entry, and ``scale = fp8_max / amax / 2^margin`` in float32 is what the next step casts with. What a
recipe keeps between steps (its *history*) is the window without its oldest entry, the
``history_len - 1`` amaxes the next step's window shares: TransformerEngine's buffer after its update,
whose slot for the next amax is zeroed. The rules the specification fixes, each a place recipes
have broken:

* the window rolls: entry ``history_len + 1`` steps old leaves it (a history that never rolls keeps
  an ancient amax and a stale scale forever);
* the scale follows the step's own amax: after a step, the scale is computed from a window that
  holds it (a recipe that computes the scale first casts one step late);
* the margin divides once (``2^margin``; applied twice, every cast loses ``margin`` binades);
* a non-finite amax (an overflowed step) enters the window, and while the amax selected from it is
  inf or NaN the scale stays as it was (never ``fp8_max / inf = 0``, which casts every value to 0);
* a selected amax of 0 (a tensor of zeros) keeps the scale (``fp8_max / 0`` is no scale);
* an amax so small that the scale overflows float32 gives float32's largest value, never inf
  (whose reciprocal, the dequantisation scale, would be 0);
* ``state_dict`` / ``load_state_dict`` round-trips history and scale bit for bit.

TransformerEngine's own two update paths differ in four places, and the specification admits
either behaviour there (:func:`admissible`): its fused kernel's ``fmaxf`` ignores a NaN in the
window where ``torch.max`` propagates it (and the scale is kept); its bulk kernel does not record a
step whose amax is 0 (nothing changes) where the Python path enters the 0; the kernel divides
``fp8_max x 2^-margin`` by the amax in one rounding where the Python path divides by ``2^margin``
after (they differ only where the scale overflows); and the Python path's ``fp8_max / amax``, a
float over a tensor, is torch's ``reciprocal() * fp8_max``, two roundings, where the kernel rounds
once (they differ by one float32 ulp for some amaxes). The scale is otherwise exact:
``fp8_max / amax`` correctly rounded to float32 (exact rational arithmetic, :func:`float32_scale`),
divided by ``2^margin``. :func:`conformance_machine` drives any :class:`DelayedScalingAdapter`
through random steps and round trips against it, as the loss-scaler suite does.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal, Protocol

import torch
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from harness.domains.machines import RecordedMachine
from harness.numerics.formats import FP8_E4M3FN, FP32, FloatFormat

Algorithm = Literal["max", "most_recent"]

#: Why a failed conformance run keeps no standalone script: no library on this stack ships delayed
#: scaling to call (torchao removed it; TransformerEngine's needs CUDA and comes through an adapter),
#: so the recipe under test is code a script cannot hold. The row keeps the failing example instead.
NO_SCRIPT = (
    "the recipe under test is the specification's plain-torch stand-in or your adapter, code a script cannot "
    "hold; the failing example (configuration, amaxes, round trips) is in the row's failure"
)

#: float32's largest finite value: the scale where ``fp8_max / amax`` overflows.
FLOAT32_MAX = FP32.max


@dataclass(frozen=True)
class DelayedConfig:
    history_len: int
    algorithm: Algorithm = "max"
    margin: int = 0
    fmt: FloatFormat = FP8_E4M3FN


@dataclass(frozen=True)
class DelayedState:
    """The specification's state: the history (the last ``history_len - 1`` amaxes, oldest first;
    inf and NaN included), which the next step's amax joins to make its window, and the scale the
    next step casts with."""

    history: tuple[float, ...] = ()
    scale: float = 1.0


def _round_to_float32(q: Fraction) -> float:
    r = FP32.round_ratio(q.numerator, q.denominator)
    return math.inf if r.bits is None else FP32.decode(r.bits)


def float32_scale(fmt: FloatFormat, amax: float, margin: int) -> float:
    """``fmt.max / amax`` correctly rounded to float32 (exact rational arithmetic), divided by
    ``2^margin`` (exact while normal; float32's rounding below); float32's largest value where it
    overflows (TransformerEngine's Python path)."""
    scale = _round_to_float32(Fraction(fmt.max) / Fraction(amax))
    if not math.isfinite(scale):
        return FLOAT32_MAX
    return float(torch.tensor(math.ldexp(scale, -margin), dtype=torch.float32))


def float32_scale_margin_first(fmt: FloatFormat, amax: float, margin: int) -> float:
    """``(fmt.max x 2^-margin) / amax`` in one float32 rounding (TransformerEngine's fused kernel),
    float32's largest value where it overflows."""
    scale = _round_to_float32(Fraction(fmt.max) / 2**margin / Fraction(amax))
    return scale if math.isfinite(scale) else FLOAT32_MAX


def float32_scale_reciprocal_first(fmt: FloatFormat, amax: float, margin: int) -> float:
    """``fmt.max / amax`` as torch evaluates a Python float over a tensor (``Tensor.__rtruediv__``
    is ``reciprocal() * other``: two float32 roundings, TransformerEngine's Python path), divided by
    ``2^margin``; float32's largest value where it overflows."""
    reciprocal = _round_to_float32(1 / Fraction(amax))
    if not math.isfinite(reciprocal):
        return FLOAT32_MAX
    scale = _round_to_float32(Fraction(reciprocal) * Fraction(fmt.max))
    if not math.isfinite(scale):
        return FLOAT32_MAX
    return float(torch.tensor(math.ldexp(scale, -margin), dtype=torch.float32))


def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def admissible(cfg: DelayedConfig, state: DelayedState, amax: float) -> dict[str, DelayedState]:
    """The states the specification admits after a step whose tensor had ``amax`` (as the float32
    it is, absolute), keyed by the behaviour that gives each: ``"recorded"`` (the rules of the
    module docstring, with ``torch.max``'s NaN), and where TransformerEngine's paths differ,
    ``"nan_ignored"``, ``"zero_not_recorded"``, ``"margin_first"`` and ``"reciprocal_first"``."""
    a = abs(_f32(amax))
    window = (*state.history, a)[-cfg.history_len :]
    history = window[1:] if len(window) == cfg.history_len else window
    out: dict[str, DelayedState] = {}
    if cfg.algorithm == "most_recent":
        candidates = {"recorded": a}
    else:
        finite_or_inf = [v for v in window if not math.isnan(v)]
        has_nan = len(finite_or_inf) < len(window)
        candidates = {"recorded": math.nan if has_nan else max(window)}
        if has_nan:
            candidates["nan_ignored"] = max(finite_or_inf, default=0.0)
    for name, selected in candidates.items():
        if not (math.isfinite(selected) and selected > 0):
            out[name] = DelayedState(history, state.scale)
            continue
        out[name] = DelayedState(history, float32_scale(cfg.fmt, selected, cfg.margin))
        for variant, scale in (
            ("margin_first", float32_scale_margin_first(cfg.fmt, selected, cfg.margin)),
            ("reciprocal_first", float32_scale_reciprocal_first(cfg.fmt, selected, cfg.margin)),
        ):
            if scale != out[name].scale:
                out.setdefault(variant, DelayedState(history, scale))
    if a == 0:
        out["zero_not_recorded"] = state
    return out


def same_state(got_history: list[float], got_scale: float, want: DelayedState) -> bool:
    """Bit-level equality of a recipe's history and scale with a specification state (whose amaxes
    :func:`admissible` already holds as float32), every NaN equal to every NaN (a payload is not
    part of the claim)."""

    def key(v: float) -> object:
        return "nan" if math.isnan(v) else v

    return key(got_scale) == key(want.scale) and [key(v) for v in got_history] == [key(v) for v in want.history]


class DelayedScalingAdapter(Protocol):
    """What a delayed-scaling recipe implements to be checked (TransformerEngine's, yours)."""

    def scale(self) -> float:
        """The scale the next step casts with (float32)."""

    def update(self, amax: float) -> None:
        """After a step: its tensor's amax (fp32; may be inf or NaN)."""

    def history(self) -> list[float]:
        """The amaxes kept for the next step's window, oldest first: the last ``history_len - 1``
        (TransformerEngine: its amax history buffer after the update, without the zeroed slot)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TorchDelayedScaling:
    """The specification in plain torch, as TransformerEngine's Python path writes it: a float32
    history buffer rolled each step, ``torch.max`` over it, the scale a float32 tensor."""

    def __init__(self, cfg: DelayedConfig) -> None:
        self.cfg = cfg
        self._history = torch.zeros(cfg.history_len, dtype=torch.float32)
        self._filled = 0
        self._scale = torch.ones((), dtype=torch.float32)

    def scale(self) -> float:
        return float(self._scale)

    def update(self, amax: float) -> None:
        self._history = torch.roll(self._history, -1)
        self._history[-1] = torch.tensor(amax, dtype=torch.float32).abs()
        self._filled = min(self._filled + 1, self.cfg.history_len)
        self._scale = self._next_scale(self._history[-self._filled :])

    def _next_scale(self, window: torch.Tensor) -> torch.Tensor:
        selected = self._selected(window)
        if not (bool(torch.isfinite(selected)) and float(selected) > 0):
            return self._scale
        scale = self._unclamped_scale(selected)
        return scale if bool(torch.isfinite(scale)) else torch.tensor(FLOAT32_MAX, dtype=torch.float32)

    def _selected(self, window: torch.Tensor) -> torch.Tensor:
        """The amax the scale comes from: the window's max (NaN propagates) or its latest entry."""
        return window.max() if self.cfg.algorithm == "max" else window[-1]

    def _unclamped_scale(self, selected: torch.Tensor) -> torch.Tensor:
        """``fp8_max / selected`` (one float64 division, rounded to float32) over ``2^margin``: inf
        where it overflows, 0 for an inf amax, NaN for a NaN one."""
        return (self.cfg.fmt.max / selected.double()).float() / 2.0**self.cfg.margin

    def history(self) -> list[float]:
        kept = min(self._filled, self.cfg.history_len - 1)
        return [float(v) for v in self._history[-kept:]] if kept else []

    def state_dict(self) -> dict[str, Any]:
        return {"history": self._history.clone(), "filled": self._filled, "scale": self._scale.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._history = state["history"].clone()
        self._filled = int(state["filled"])
        self._scale = state["scale"].clone()


Factory = Callable[[DelayedConfig], DelayedScalingAdapter]


#: Amaxes a step may see: any finite float32 magnitude, and the edges (0, 1, e4m3's 448, near the
#: float32 extremes, infinities, NaN).
AMAXES = st.one_of(
    st.floats(min_value=2.0**-100, max_value=2.0**100, allow_nan=False, allow_infinity=False, width=32),
    st.sampled_from([0.0, 1.0, 448.0, 1e-38, 3.0e38, math.inf, -math.inf, math.nan]),
)


class DelayedScalingMachine(RecordedMachine):
    """A delayed-scaling recipe (``factory``) against the specification: random configurations,
    steps with amaxes across the format's range (zeros, subnormal-small, huge, inf, NaN) and
    state_dict round trips into a fresh instance. Run ``DelayedScalingMachine.bound(factory=...)``;
    its counts tally the rules run and the admitted behaviours taken."""

    factory: Factory

    @initialize(
        history_len=st.integers(1, 16),
        algorithm=st.sampled_from(["max", "most_recent"]),
        margin=st.integers(0, 3),
    )
    def setup(self, history_len: int, algorithm: Algorithm, margin: int) -> None:
        self.cfg = DelayedConfig(history_len, algorithm, margin)
        self.start({"history_len": history_len, "algorithm": algorithm, "margin": margin})
        self.impl = self.factory(self.cfg)
        self.ref = DelayedState()

    @rule(amax=AMAXES)
    def step(self, amax: float) -> None:
        self.record("step", amax)
        self.counts["step"] += 1
        self.counts["non_finite" if not math.isfinite(amax) else "finite"] += 1
        before = self.ref
        admitted = admissible(self.cfg, before, amax)
        self.impl.update(amax)
        got_history, got_scale = self.impl.history(), self.impl.scale()
        taken = next((name for name, s in admitted.items() if same_state(got_history, got_scale, s)), None)
        assert taken is not None, (
            f"{self.cfg}: after a step with amax {amax!r} from history {list(before.history)} and scale "
            f"{before.scale!r}: scale {got_scale!r}, history {got_history}; the specification admits "
            + "; ".join(f"{name}: scale {s.scale!r}, history {list(s.history)}" for name, s in admitted.items())
        )
        self.counts[f"admitted.{taken}"] += 1
        if taken != "zero_not_recorded" and len(before.history) == self.cfg.history_len - 1:
            self.counts["rolled"] += 1
        self.ref = admitted[taken]

    @rule()
    def round_trip(self) -> None:
        self.record("round_trip", None)
        self.counts["round_trip"] += 1
        fresh = self.factory(self.cfg)
        fresh.load_state_dict(self.impl.state_dict())
        self.impl = fresh

    @invariant()
    def matches_the_specification(self) -> None:
        if not hasattr(self, "impl"):
            return
        got_scale, got_history = self.impl.scale(), self.impl.history()
        assert same_state(got_history, got_scale, self.ref), (
            f"{self.cfg}: scale {got_scale!r} (specification {self.ref.scale!r}), history {got_history} "
            f"(specification {list(self.ref.history)})"
        )


def conformance_machine(factory: Factory, counts: Counter[str] | None = None) -> type:
    """:class:`DelayedScalingMachine` bound to ``factory``: after every step the adapter's scale
    and history must be one of the states the specification admits (:func:`admissible`), and after
    a round trip the state it had, bit for bit. ``counts`` tallies the rules run and the admitted
    behaviours taken (so a check can require they were exercised, and a report can say which of
    TransformerEngine's paths a recipe follows)."""
    return DelayedScalingMachine.bound(factory=factory, counts=counts)
