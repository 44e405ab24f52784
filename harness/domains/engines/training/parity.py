"""Parity of an AMP run with fp32: the seed band, the per-checkpoint distances, and the checks
run as one call (:func:`check_parity`, :func:`is_deterministic`)."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from harness.domains.engines.training import recipes as named
from harness.domains.engines.training.amp_lane import lane_steps
from harness.domains.engines.training.loop import Run, train
from harness.domains.engines.training.recipes import FP32, Recipe, Setup
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP32 as FP32_FORMAT


@dataclass(frozen=True)
class Band:
    """Seed-to-seed spread of fp32 runs at each checkpoint: the median over all pairs of seeds of
    |L_i(t) - L_j(t)| (n seeds give n(n-1)/2 pairs; a median, unlike the largest of a few
    distances, does not vanish where two seeds happen to cross)."""

    per_step: dict[int, float]
    seeds: int


#: The false-alarm rate a golden curve's outlier allowance is chosen for: 1 clean curve in 100.
CURVE_FALSE_ALARM = 0.01


@dataclass(frozen=True)
class OutlierAllowance:
    """How many steps of a clean curve may lie outside the per-step seed spread, and how many of
    them in a row."""

    steps: int
    longest_run: int


def _no_run_at_least(steps: int, p: float, length: int) -> float:
    """P(no run of ``length`` or more consecutive successes in ``steps`` Bernoulli(p) trials)."""
    state = [1.0] + [0.0] * (length - 1)  # probability of ending in a run of each length < length
    for _ in range(steps):
        nxt = [0.0] * length
        for run, prob in enumerate(state):
            nxt[0] += prob * (1 - p)
            if run + 1 < length:
                nxt[run + 1] += prob * p
        state = nxt
    return sum(state)


def outlier_allowance(steps: int, seeds: int, alpha: float = CURVE_FALSE_ALARM) -> OutlierAllowance:
    """Steps a clean curve may spend outside the per-step seed spread, from the false-alarm rate.

    The allowance at a step is the largest distance of ``seeds - 1`` fp32 seeds from seed 0; a
    curve exchangeable with those seeds exceeds it with probability ``p = 1 / seeds`` (it is the
    largest of ``seeds`` exchangeable distances that often). With steps taken as independent, the
    count of exceedances is Binomial(steps, p): the allowance is the smallest count k with
    P(X > k) <= alpha / 2, and the longest run of consecutive exceedances the smallest r with
    P(a run longer than r) <= alpha / 2 (a sustained regression makes a long run; isolated
    coincidences do not). Successive steps of real curves are positively correlated, which makes
    runs likelier than this model says: the measured rate is in docs/decision-rules.md.
    """
    p = 1.0 / seeds
    tail, count = 1.0, steps
    for k in range(steps + 1):
        tail -= math.comb(steps, k) * p**k * (1 - p) ** (steps - k)
        if tail <= alpha / 2:
            count = k
            break
    run = next((r for r in range(1, steps + 1) if 1 - _no_run_at_least(steps, p, r + 1) <= alpha / 2), steps)
    return OutlierAllowance(count, run)


def per_step_spread(runs: Sequence[Run]) -> list[float]:
    """Per training step, the largest distance of another seed's training loss from seed 0's
    (the golden curves' allowance)."""
    ref = runs[0].losses
    return [max(abs(r.losses[t] - v) for r in runs[1:]) for t, v in enumerate(ref)]


def seed_band(runs: Sequence[Run]) -> Band:
    """Per checkpoint, the median distance between the evaluation losses of two fp32 seeds."""
    if len(runs) < 2:
        raise ValueError(f"a seed band needs at least 2 seeds, got {len(runs)}")
    pairs = list(itertools.combinations(runs, 2))
    return Band(
        {t: statistics.median(abs(a.eval_losses[t] - b.eval_losses[t]) for a, b in pairs) for t in runs[0].eval_losses},
        len(runs),
    )


#: An AMP recipe may move the evaluation loss at most this fraction of what changing the data
#: order typically does (the band's median pairwise distance): at the full distance it would be
#: indistinguishable from a different seed, not the same run. Its measured error rates (false
#: alarms of clean recipes over many seeds, the smallest injected fault it catches) are in
#: harness.domains.engines.training.rates and docs/decision-rules.md.
PARITY_FRACTION = 0.5
#: A negative control must miss parity by at least this factor of the seed spread somewhere, or the
#: suite is not sensitive enough to tell a broken recipe from seed noise.
CONTROL_FACTOR = 2.0


@dataclass(frozen=True)
class Parity:
    recipe: str
    steps: list[int]
    diffs: list[float]
    allowances: list[float]
    #: fp32 seeds of the band the allowances come from
    seeds: int = 0

    @property
    def ratios(self) -> list[float]:
        return [
            d / a if a > 0 else (math.inf if d > 0 else 0.0) for d, a in zip(self.diffs, self.allowances, strict=True)
        ]

    @property
    def worst(self) -> float:
        return max(self.ratios)

    @property
    def passed(self) -> bool:
        return self.worst <= 1.0

    @property
    def first_failed_step(self) -> int | None:
        """The first checkpoint whose distance leaves its allowance (None: none does)."""
        return next((t for t, d, a in zip(self.steps, self.diffs, self.allowances, strict=True) if not d <= a), None)


def parity(run: Run, reference: Run, band: Band, fraction: float = PARITY_FRACTION) -> Parity:
    """Evaluation-loss distance of ``run`` from ``reference`` (same seed) at each checkpoint,
    against ``fraction`` of the seed band there."""
    steps = sorted(reference.eval_losses)
    diffs = [
        abs(run.eval_losses[t] - reference.eval_losses[t]) if math.isfinite(run.eval_losses[t]) else math.inf
        for t in steps
    ]
    return Parity(run.recipe, steps, diffs, [fraction * band.per_step[t] for t in steps], band.seeds)


@dataclass
class RecipeResult:
    recipe: Recipe
    run: Run
    reference: Run
    parity: Parity


@dataclass
class ParityReport:
    setup: str
    band: Band
    fp32_runs: list[Run]
    results: list[RecipeResult]


def reference_for(setup: Setup, recipe: Recipe, run: Run, fp32_run: Run, device: torch.device | str = "cpu") -> Run:
    """The fp32 run ``run`` (of ``recipe``, on ``fp32_run``'s seed) is compared with: ``fp32_run``
    itself where the recipe's fp32 counterpart is plain fp32 and no step was skipped; else that
    counterpart (same accumulation, clipping, loss factor) on the seed with the skipped steps replayed."""
    cp = recipe.fp32_counterpart()
    plain = cp.micro_batches == 1 and cp.clip is None and cp.loss_factor == 1.0
    if plain and not run.skipped_at:
        return fp32_run
    return train(setup, cp, fp32_run.seed, device, frozenset(run.skipped_at))


#: fp32 seeds of a band where the caller does not say (the suite uses more on its cheap models).
DEFAULT_SEEDS = 5
#: Evaluation checkpoints a verdict needs: parity is judged at each, the AMP lane takes the median
#: over the steps that follow them; with one, a single state decides.
MIN_CHECKPOINTS = 2


def validate(setup: Setup, recipes: object, seeds: object) -> list[Recipe]:
    """Refuse a call that could only give a vacuous verdict, before anything trains: an empty or
    non-recipe list, fp32 as a recipe to check, fewer than 2 seeds, too few checkpoints."""

    choices = ", ".join(
        sorted(n for n, v in vars(named).items() if isinstance(v, Recipe) and not v.control and v.dtype is not None)
    )
    if isinstance(recipes, Recipe | str) or not isinstance(recipes, list | tuple):
        raise TypeError(f"recipes must be a list of Recipe objects, got {type(recipes).__name__}; e.g. [{choices}]")
    if not recipes:
        raise ValueError(f"no recipes to check: an empty list judges nothing; pass some of {choices}")
    bad = [r for r in recipes if not isinstance(r, Recipe)]
    if bad:
        raise TypeError(
            f"not a recipe: {', '.join(repr(b) for b in bad)}; recipes are Recipe objects from "
            f"harness.api ({choices}) or Recipe(name, dtype=..., scaler=...)"
        )
    plain = [r.name for r in recipes if r.dtype is None and r.params_dtype is None and r.emulate is None]
    if plain:
        raise ValueError(
            f"recipe(s) {', '.join(plain)} run in fp32: fp32 is the reference every recipe is judged against, not a "
            f"recipe to check; pass low-precision recipes ({choices})"
        )
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ValueError(
            f"seeds={seeds!r}: the parity band is the spread between fp32 seeds and needs at least 2 "
            f"(default {DEFAULT_SEEDS}; more seeds make the band steadier)"
        )
    points = setup.checkpoints()
    if len(points) < MIN_CHECKPOINTS:
        raise ValueError(
            f"Setup {setup.name!r}: steps={setup.steps} with checkpoint_every={setup.checkpoint_every} gives "
            f"{len(points)} evaluation checkpoint(s); a verdict needs at least {MIN_CHECKPOINTS}: train at least "
            f"{MIN_CHECKPOINTS * setup.checkpoint_every} steps, or checkpoint more often"
        )
    return list(recipes)


def check_parity(
    setup: Setup,
    recipes: Sequence[Recipe],
    seeds: int = DEFAULT_SEEDS,
    device: torch.device | str = "cpu",
    fp32_runs: Sequence[Run] | None = None,
) -> ParityReport:
    """Run fp32 over ``seeds`` seeds (the band), each recipe on seed 0, and each recipe's fp32
    counterpart on seed 0 with the recipe's skipped steps replayed; compare at the checkpoints.
    Each recipe's run keeps its states at the checkpoints (the AMP lane starts from them). A call
    that could only be vacuous is refused before anything trains (:func:`validate`)."""
    recipes = validate(setup, recipes, seeds if fp32_runs is None else max(seeds, 2))
    fp = list(fp32_runs) if fp32_runs is not None else [train(setup, FP32, s, device) for s in range(seeds)]
    band = seed_band(fp)
    results = []
    for recipe in recipes:
        run = train(setup, recipe, 0, device, keep_states_at=lane_steps(setup))
        ref = reference_for(setup, recipe, run, fp[0], device)
        results.append(RecipeResult(recipe, run, ref, parity(run, ref, band)))
    return ParityReport(setup.name, band, fp, results)


def is_deterministic(
    setup: Setup, recipe: Recipe, device: torch.device | str = "cpu", first: Run | None = None
) -> tuple[bool, int | None]:
    """Run the recipe twice (``first``: a run of it at seed 0 already made, e.g. by the parity
    check, which then counts as the first); (bitwise-identical losses?, first differing step)."""
    a = first if first is not None else train(setup, recipe, 0, device)
    b = train(setup, recipe, 0, device)
    for t, (x, y) in enumerate(zip(a.losses, b.losses, strict=True)):
        if x != y and not (math.isnan(x) and math.isnan(y)):
            return False, t
    return True, None


# -- verdicts -----------------------------------------------------------------------------------
#: A parity verdict is about training, so it needs training to have happened. At least this share
#: of the optimizer steps must be taken: skipped steps are replayed as skipped on the fp32
#: reference, so each one is left out of the comparison on both sides, and a recipe whose scaler
#: skipped most of its steps is judged on a minority of its own run (its finding is the skipping).
MIN_TAKEN_SHARE = 0.5
#: ... and the fp32 reference's parameters must have moved by more than float32 resolution
#: (relative change above fp32's unit roundoff 2^-24): below it both runs are their initial
#: weights and a difference of 0 says nothing.
MIN_PARAM_CHANGE = FP32_FORMAT.unit_roundoff


def conclusive(setup: str, r: RecipeResult) -> ClaimComparison | None:
    """None when the recipe's run can be judged; else the INCONCLUSIVE claim with the counts.
    Negative controls are exempt (a recipe whose gradients flush to zero is meant to fail)."""
    if r.recipe.control:
        return None
    steps = len(r.run.losses)
    taken, change = r.run.taken_steps, r.reference.param_change
    if taken >= MIN_TAKEN_SHARE * steps and change > MIN_PARAM_CHANGE:
        return None
    scales = f" (loss scale {r.run.scales[0]:g} -> {r.run.final_scale:g})" if r.run.scales else ""
    return compare_claim(
        f"{setup}.{r.recipe.metric_id}.taken_steps",
        taken,
        False,
        f"a parity verdict needs >= {MIN_TAKEN_SHARE:.0%} of the optimizer steps taken and the fp32 reference's "
        f"parameters moved (relative change > fp32 unit roundoff {MIN_PARAM_CHANGE:.3g})",
        detail=(
            f"{setup} / {r.recipe.name}: {steps - taken} of {steps} optimizer steps skipped{scales}; fp32 reference "
            f"parameters moved {change:.3g} (relative), the AMP run's {r.run.param_change:.3g}: this tested nothing",
            "remedy: train more steps, or start the scaler lower (GradScaler(init_scale=...)) so fewer calibration "
            "steps are skipped",
        ),
        expected=MIN_TAKEN_SHARE * steps,
        unit="steps",
        inconclusive=True,
    )


def judge_clipping(setup: str, r: RecipeResult) -> ClaimComparison | None:
    """For a recipe that clips: whether clipping bound (total norm > max norm) on some taken step.
    A run where it never did tested nothing clipping does: INCONCLUSIVE. None for other recipes."""
    if r.recipe.clip is None:
        return None
    finite = [n for n in r.run.clip_norms if math.isfinite(n)]
    binding = sum(n > r.recipe.clip for n in finite)
    return compare_claim(
        f"{setup}.{r.recipe.metric_id}.clip_binding_steps",
        binding,
        binding > 0,
        f"clip_grad_norm_({r.recipe.clip:g}) binds (total norm > {r.recipe.clip:g}) on some step with a finite "
        "norm: otherwise the recipe's clipping was never exercised",
        detail=(
            f"{setup} / {r.recipe.name}: clipping bound on {binding} of {len(finite)} steps with a finite norm "
            f"(norms {min(finite, default=math.nan):.3g} to {max(finite, default=math.nan):.3g}); choose a max norm "
            "below the gradients' norm",
        ),
        unit="steps",
        inconclusive=True,
    )


def judge(setup: str, r: RecipeResult) -> ClaimComparison:
    """The parity verdict of one recipe, decided once: INCONCLUSIVE when it tested nothing
    (:func:`conclusive`); an AMP recipe must stay within the allowance (worst |diff|/allowance <=
    1); a negative control must miss it by CONTROL_FACTOR."""
    vacuous = conclusive(setup, r)
    if vacuous is not None:
        return vacuous
    p = r.parity
    name = f"{setup}.{r.recipe.metric_id}.worst_diff_over_allowance"
    if r.recipe.control:
        return compare_claim(
            name,
            p.worst,
            p.worst >= CONTROL_FACTOR,
            f"negative control: worst |L_amp - L_fp32| / allowance >= {CONTROL_FACTOR} somewhere",
            detail=(
                f"negative control {r.recipe.name!r} stayed within {p.worst:.3g} x the parity allowance (needs >= "
                f"{CONTROL_FACTOR}): the suite is not sensitive enough to tell this broken recipe from seed noise",
            ),
            allowance=CONTROL_FACTOR,
        )
    return compare_claim(
        name,
        p.worst,
        p.passed,
        f"|L_amp - L_fp32| at every evaluation checkpoint <= {PARITY_FRACTION} x the fp32 seed band "
        f"(median pairwise distance of {p.seeds} seeds)",
        detail=(
            f"{setup} / {r.recipe.name}: eval loss moved more than {PARITY_FRACTION} x the fp32 seed spread "
            f"(median pairwise distance of {p.seeds} seeds) "
            f"(skipped steps replayed on the reference: {r.run.skipped_at}):",
            *(
                f"step {t}: |diff| {d:.4g} > allowance {a:.4g}"
                for t, d, a in zip(p.steps, p.diffs, p.allowances, strict=True)
                if not d <= a
            ),
        ),
        allowance=1.0,
    )


def judge_determinism(setup: str, recipe: Recipe, same: bool, first: int | None) -> ClaimComparison:
    """Bitwise-identical losses on a rerun ("nondeterministic" is its own failure, not a regression)."""
    return compare_claim(
        f"{setup}.{recipe.metric_id}.deterministic",
        same,
        same,
        "a rerun gives bitwise-identical losses",
        detail=(
            f"nondeterministic: {setup} / {recipe.name} gave different losses from step {first} on a rerun "
            "(not a regression: fix determinism first)",
        ),
    )
