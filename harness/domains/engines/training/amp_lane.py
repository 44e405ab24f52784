"""The AMP lane: each training step of the AMP run, taken again from the run's own state, against
float64, next to the same step taken by a correctly rounded recipe emulated in float64.

Parity compares whole trajectories against the spread that changing the data order causes: a
recipe has to be grossly wrong before that shows (docs/decision-rules.md). A trajectory's distance
from float64 does not help either: in these short runs any perturbation at the low-precision
format's scale, a single flipped rounding or a gross fault, saturates to the same distance
(measured on the tiny LM: relative gradient noise from 2^-24 to 2^-5 all landed within 10% of
clean bf16). So the lane judges *steps*, where errors add instead of saturating:

1. the AMP run keeps its state (weights, optimizer moments, the next batch, the loss scale) at
   each evaluation checkpoint;
2. from that state, the next update ``d = theta' - theta`` is taken three times: by the recipe
   itself (``d_amp``), in float64 (``d_64``, the exact step), and by the recipe emulated in
   float64 with autocast's low-precision functions rounded to the format
   (:mod:`harness.domains.engines.training.emulation`), fp32 master weights, and, for fp16, a loss scale
   (``d_emu``, what correct rounding to the format costs);
3. ``e_amp = ||d_amp - d_64|| / ||d_64||`` and ``e_emu`` likewise; the statistic is the median over
   checkpoints of ``e_amp / e_emu``.

The rule: the median ratio is at most ``LANE_FACTOR = 2``. The error of a correctly rounded step
is proportional to the format's unit roundoff (first-order rounding analysis), so 2 is the error
of the same recipe correctly rounded to one significand bit fewer (u -> 2u): an AMP step less
accurate than that has lost precision that its format does not explain (a GEMM accumulating in
low precision, a loss or softmax computed in it, gradients rounded after unscaling, weights
updated in low precision, gradients flushed by fp16 without loss scaling). Nothing in the
reference uses a low-precision kernel, so it does not drift with the stack. Measured error rates
(clean runs per model, the smallest injected fault caught) are in :mod:`harness.domains.engines.training.rates`
and docs/decision-rules.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from harness.domains.engines.training.emulation import CorrectAttention, RoundingMode
from harness.domains.engines.training.loop import Run, State, largest_gradient, step_from
from harness.domains.engines.training.recipes import Recipe, Setup, metric_id
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import format_of

#: An AMP step may be at most this many times less accurate than the same step correctly rounded
#: to its format: the error of one significand bit fewer (see the module docstring).
LANE_FACTOR = 2.0
#: The fp16 emulation's loss scale: the largest power of two that leaves this much headroom above
#: the largest fp32 parameter gradient (activation gradients can be larger), halved while the
#: emulated step overflows, at most MAX_BACKOFF times: a correctly scaled fp16 step.
FP16_HEADROOM = 2.0**8
MAX_BACKOFF = 40


def lane_dtype(recipe: Recipe) -> torch.dtype | None:
    """The low-precision format a recipe's steps are judged against (None: an fp32 recipe)."""
    return recipe.dtype or recipe.params_dtype


@dataclass(frozen=True)
class StepError:
    """One checkpoint: the relative errors of the AMP step and of the correctly rounded step."""

    step: int
    amp: float
    emulated: float
    #: the AMP step's error with the stack's own attention kernel (``amp`` takes it correctly rounded)
    with_kernel: float | None = None

    @property
    def ratio(self) -> float:
        return ratio_of(self.amp, self.emulated)

    @property
    def kernel_ratio(self) -> float | None:
        return None if self.with_kernel is None else ratio_of(self.with_kernel, self.emulated)


def ratio_of(a: float, b: float) -> float:
    """a / b, with 0 / 0 = 0 and a / 0 = inf."""
    if b > 0:
        return a / b
    return 0.0 if a == 0 else math.inf


@dataclass(frozen=True)
class LaneReference:
    """The exact and the correctly rounded step from each kept state of one run."""

    setup: str
    dtype: torch.dtype
    exact: dict[int, torch.Tensor]
    before: dict[int, torch.Tensor]
    emulated_error: dict[int, float]
    #: low-precision function calls the emulation rounded in one step (0: it knows none of the model's)
    calls: int
    #: the recipe the correct rounding is to, where ``dtype`` alone does not name it (block scaling)
    label: str = ""
    #: the correctly rounded steps themselves, where a check compares another step with them
    emulated_steps: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class AmpLane:
    setup: str
    recipe: str
    dtype: torch.dtype
    errors: tuple[StepError, ...]
    #: checkpoints left out: the run's scaler skipped the next step, or the step was not finite
    left_out: tuple[int, ...]
    calls: int

    #: attention calls in one AMP step (their kernel is measured apart: ``kernel_ratio``)
    attention_calls: int = 0
    #: the recipe the correct rounding is to, where ``dtype`` alone does not name it (block scaling)
    label: str = ""

    @property
    def ratio(self) -> float:
        """Median over checkpoints of e_amp / e_emu (inf with no checkpoint to judge)."""
        return statistics.median(e.ratio for e in self.errors) if self.errors else math.inf

    @property
    def kernel_ratio(self) -> float | None:
        """The same median with the stack's attention kernel instead of a correctly rounded one."""
        found = [e.kernel_ratio for e in self.errors if e.kernel_ratio is not None]
        return statistics.median(found) if found else None


def lane_steps(setup: Setup) -> frozenset[int]:
    """The states the lane starts from: the evaluation checkpoints."""
    return frozenset(setup.checkpoints())


def relative_error(d: torch.Tensor, exact: torch.Tensor) -> float:
    """||d - exact|| / ||exact|| (inf where not finite)."""
    norm = float(exact.norm())
    diff = float((d - exact).norm())
    if not math.isfinite(diff):
        return math.inf
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def _emulated_step(
    setup: Setup, recipe: Recipe, dtype: torch.dtype, state: State, device: torch.device | str, seed: int, step: int
) -> tuple[torch.Tensor, torch.Tensor, int] | None:
    """The correctly rounded step (parameters before, after with fp32 master weights, rounded calls),
    or None where no loss scale makes it finite."""
    base = replace(recipe.fp32_counterpart(), emulate=dtype)
    scale = None
    if dtype == torch.float16:
        largest = largest_gradient(setup, recipe, state, device)
        top = format_of(dtype).max / FP16_HEADROOM / largest if largest > 0 else 2.0**16
        scale = 2.0 ** math.floor(math.log2(top))
    for _ in range(MAX_BACKOFF):
        emulated = replace(base, static_scale=scale)
        counter = RoundingMode(dtype)
        before, after = step_from(
            setup, emulated, state, device, params_dtype=torch.float64, seed=seed, step=step, mode=counter
        )
        if bool(torch.isfinite(after).all()):
            # fp32 master weights: the updated parameters are stored in fp32
            return before, after.float().double(), counter.calls
        if scale is None:
            return None
        scale /= 2
    return None


def lane_reference(
    setup: Setup, run: Run, dtype: torch.dtype, recipe: Recipe, device: torch.device | str = "cpu"
) -> LaneReference:
    """The exact and the correctly rounded step from each state ``run`` kept (``recipe`` gives the
    accumulation, clipping and loss factor the steps share)."""
    if not run.states:
        raise ValueError(
            f"run {run.recipe!r} kept no states: train it with keep_states_at=lane_steps(setup) for the AMP lane"
        )
    exact, before, emulated, calls = {}, {}, {}, 0
    for t, state in sorted(run.states.items()):
        b64, a64 = step_from(setup, recipe.fp32_counterpart(), state, device, params_dtype=torch.float64)
        emu = _emulated_step(setup, recipe, dtype, state, device, run.seed, t + 1)
        if emu is None or not bool(torch.isfinite(a64).all()):
            continue
        exact[t], before[t] = a64 - b64, b64
        emulated[t] = relative_error(emu[1] - emu[0], a64 - b64)
        calls = max(calls, emu[2])
    return LaneReference(setup.name, dtype, exact, before, emulated, calls)


def amp_lane(
    setup: Setup,
    recipe: Recipe,
    run: Run,
    reference: LaneReference,
    device: torch.device | str = "cpu",
    kernel: bool = True,
) -> AmpLane:
    """``recipe``'s step from each of ``run``'s kept states against ``reference``. ``recipe`` may
    differ from the run's own (a positive control, a fault): its step is taken from the same states.
    ``kernel``: also take each step with the stack's own attention kernel (``kernel_ratio``)."""
    errors, left_out, attention = [], [], 0
    for t, state in sorted(run.states.items()):
        if t not in reference.exact or (recipe.scaler and t + 1 in run.skipped_at):
            left_out.append(t)
            continue
        correct = CorrectAttention()
        before, after = step_from(setup, recipe, state, device, seed=run.seed, step=t + 1, mode=correct)
        if bool((after == before).all()) and recipe.scaler:
            left_out.append(t)  # the scaler skipped this step from this state
            continue
        exact = reference.exact[t]
        with_kernel: float | None = None
        if correct.calls:
            attention = correct.calls
        if correct.calls and kernel:
            b, a = step_from(setup, recipe, state, device, seed=run.seed, step=t + 1)
            with_kernel = relative_error(a - b, exact)
        errors.append(StepError(t, relative_error(after - before, exact), reference.emulated_error[t], with_kernel))
    return AmpLane(
        setup.name,
        recipe.name,
        reference.dtype,
        tuple(errors),
        tuple(left_out),
        reference.calls,
        attention,
        reference.label,
    )


def check_lane(
    setup: Setup, recipe: Recipe, run: Run, device: torch.device | str = "cpu", reference: LaneReference | None = None
) -> tuple[AmpLane, LaneReference]:
    """The lane of ``recipe`` from the states of ``run`` (a run of it, or of a clean recipe)."""
    dtype = lane_dtype(recipe)
    if dtype is None:
        raise ValueError(f"recipe {recipe.name!r} runs in fp32: the AMP lane judges low-precision recipes")
    ref = reference if reference is not None else lane_reference(setup, run, dtype, recipe, device)
    return amp_lane(setup, recipe, run, ref, device), ref


def judge_lane(lane: AmpLane, control: bool = False, blind: Sequence[Control] = ()) -> ClaimComparison:
    """The lane's verdict: INCONCLUSIVE when nothing could be judged; an AMP recipe's median ratio
    at most LANE_FACTOR; a negative control's above it. ``blind``: canonical failures the lane did
    not see on this setup (:func:`power`): a recipe that passes is INCONCLUSIVE, naming them."""
    short = lane.label or format_of(lane.dtype).short
    name = f"{lane.setup}.{metric_id(lane.recipe)}.amp_lane_error_ratio"
    per_step = ", ".join(f"step {e.step + 1}: {e.amp:.3g} vs {e.emulated:.3g} ({e.ratio:.3g}x)" for e in lane.errors)
    criterion = (
        f"median over checkpoints of the AMP step's error / the correctly rounded {short} step's error (both "
        f"against float64, from the run's own state) <= {LANE_FACTOR:g}: the error of one significand bit fewer"
    )
    if lane.calls == 0 or not lane.errors:
        why = (
            "the emulation rounded no call: the model calls none of autocast's low-precision functions it knows "
            "(harness.domains.engines.training.emulation.LOW_PRECISION_FUNCTIONS)"
            if lane.calls == 0
            else f"no checkpoint could be judged (left out: {lane.left_out}: skipped or non-finite steps)"
        )
        return compare_claim(
            name,
            lane.ratio,
            False,
            criterion,
            detail=(f"{lane.setup} / {lane.recipe}: the AMP lane tested nothing: {why}",),
            allowance=LANE_FACTOR,
            unit="x",
            inconclusive=True,
        )
    if control:
        return compare_claim(
            name,
            lane.ratio,
            lane.ratio > LANE_FACTOR,
            f"negative control: {criterion} does not hold",
            detail=(
                f"negative control {lane.recipe!r}: its steps are only {lane.ratio:.3g}x as far from float64 as "
                f"correctly rounded {short} steps (needs > {LANE_FACTOR:g}); per step: {per_step}",
            ),
            allowance=LANE_FACTOR,
            unit="x",
        )
    if lane.ratio <= LANE_FACTOR and blind:
        return compare_claim(
            name,
            lane.ratio,
            False,
            criterion,
            detail=(
                f"{lane.setup} / {lane.recipe}: its steps are {lane.ratio:.3g}x as far from float64 as correctly rounded "
                f"{short} steps (allowed {LANE_FACTOR:g}x), but on this setup the rules cannot see "
                + "; nor ".join(c.recipe.name for c in blind)
                + ": a PASS here would not tell a broken recipe from this one",
                *(f"{c.recipe.name}: {c.explain()}" for c in blind),
            ),
            allowance=LANE_FACTOR,
            unit="x",
            inconclusive=True,
        )
    return compare_claim(
        name,
        lane.ratio,
        lane.ratio <= LANE_FACTOR,
        criterion,
        detail=(
            f"{lane.setup} / {lane.recipe}: its training steps are a median {lane.ratio:.3g}x as far from float64 as "
            f"the same steps correctly rounded to {short} (allowed {LANE_FACTOR:g}x: one significand bit fewer): "
            "the recipe loses precision its format does not explain",
            f"per step (relative update error, AMP vs correctly rounded): {per_step}",
        ),
        allowance=LANE_FACTOR,
        unit="x",
    )


def ladder_lanes(
    setup: Setup,
    recipe: Recipe,
    run: Run,
    reference: LaneReference,
    levels: Sequence[float],
    device: torch.device | str = "cpu",
) -> dict[float, AmpLane]:
    """The lane of ``recipe`` with relative gradient noise of each level injected into its steps."""
    return {
        level: amp_lane(
            setup,
            replace(recipe, name=f"{recipe.name}+noise({level:.3g})", grad_noise=level),
            run,
            reference,
            device,
            kernel=False,
        )
        for level in levels
    }


# -- detection power on a setup ------------------------------------------------------------------
def _control(recipe: Recipe, name: str, dtype: torch.dtype, params_dtype: torch.dtype | None = None) -> Recipe:
    """A broken recipe with ``recipe``'s accumulation, clipping and loss factor."""
    return Recipe(
        name,
        dtype=dtype,
        params_dtype=params_dtype,
        micro_batches=recipe.micro_batches,
        clip=recipe.clip,
        loss_factor=recipe.loss_factor,
        control=True,
    )


def master_weights_control(recipe: Recipe) -> Recipe:
    """The explainer's "no fp32 master weights": parameters and optimizer in bf16, under bf16 autocast."""
    return _control(
        recipe, "bf16 parameters, no fp32 master weights", dtype=torch.bfloat16, params_dtype=torch.bfloat16
    )


def no_scaling_control(recipe: Recipe) -> Recipe:
    """The explainer's "fp16 without loss scaling": fp16 autocast, gradients as they come."""
    return _control(recipe, "fp16 without loss scaling", dtype=torch.float16)


def canonical_controls(recipe: Recipe) -> list[Recipe]:
    """The canonical broken recipes a PASS of ``recipe`` must be told apart from."""
    controls = [master_weights_control(recipe)]
    if lane_dtype(recipe) == torch.float16:
        controls.append(no_scaling_control(recipe))
    return controls


@dataclass(frozen=True)
class Control:
    """A canonical broken recipe's steps from a clean run's states, and whether the lane sees it."""

    recipe: Recipe
    lane: AmpLane
    #: share of the setup's fp32 gradient values below fp16's smallest subnormal (census), if known
    underflow_share: float | None = None
    lr: float | None = None

    @property
    def caught(self) -> bool:
        return bool(self.lane.errors) and self.lane.ratio > LANE_FACTOR

    def explain(self) -> str:
        """What the lane saw of this failure, and what would let it see it."""
        seen = f"its steps are only {self.lane.ratio:.3g}x as far from float64 as correctly rounded ones (needs > {LANE_FACTOR:g})"
        if self.recipe.params_dtype is not None:
            return (
                f"{seen}: this setup's updates are large against bf16's spacing at its weights (lr {self.lr:g}), so "
                "little is lost without master weights at this length and learning rate; the failure shows where "
                "updates are small against the weights: train at the learning rate and length you use (a smaller "
                "learning rate, a longer run), or check more steps (Setup(steps=...))"
            )
        share = f"{self.underflow_share:.2%}" if self.underflow_share is not None else "few"
        return (
            f"{seen}: fp16 flushes {share} of this setup's fp32 gradient values to zero, too few to matter at these "
            "steps; the failure shows where gradients are small: a longer run, a smaller loss (Setup(steps=...)), "
            "or your real model size"
        )


def power(
    setup: Setup,
    recipe: Recipe,
    run: Run,
    references: dict[torch.dtype, LaneReference],
    device: torch.device | str = "cpu",
    underflow_share: float | None = None,
) -> list[Control]:
    """The canonical broken recipes' steps from the states of ``run`` (a clean run of ``recipe``):
    which of them the lane sees on this setup. ``references`` is filled with what it computes."""
    controls = []
    for control in canonical_controls(recipe):
        dtype = lane_dtype(control)
        assert dtype is not None
        if dtype not in references:
            references[dtype] = lane_reference(setup, run, dtype, control, device)
        lane = amp_lane(setup, control, run, references[dtype], device, kernel=False)
        controls.append(Control(control, lane, underflow_share, setup.lr))
    return controls


def judge_control(setup: str, control: Control) -> ClaimComparison:
    """A canonical failure the lane must see on this setup; not seeing it makes the setup's PASS
    verdicts INCONCLUSIVE (this claim is their precondition)."""
    return compare_claim(
        f"{setup}.power.{control.recipe.metric_id}.amp_lane_error_ratio",
        control.lane.ratio,
        control.caught,
        f"positive control: the AMP lane fails {control.recipe.name!r} on this setup (ratio > {LANE_FACTOR:g})",
        detail=(f"{setup}: the rules cannot see {control.recipe.name!r}: {control.explain()}",),
        allowance=LANE_FACTOR,
        unit="x",
        inconclusive=True,
    )


#: Relative gradient-noise levels of the detection ladder on a user's setup, smallest first.
POWER_LADDER: tuple[float, ...] = tuple(2.0**k for k in (-12, -10, -8, -7, -6, -5, -4, -3, -2, -1, 0))


def detection_limit(lanes: dict[float, AmpLane]) -> float | None:
    """The smallest noise level whose lane fails, above which every level fails too."""
    limit = None
    for level in sorted(lanes, reverse=True):
        if not lanes[level].ratio > LANE_FACTOR:
            break
        limit = level
    return limit
