"""The verdicts on a user's own training code (:mod:`harness.domains.training.user_step`): the
same rules ``amp_training.check`` applies to a ``Setup``, judged from observed runs.

* **parity** of every loss the code returns, at every step: the AMP run against fp32 on the same
  seed, within :data:`~harness.domains.engines.training.parity.PARITY_FRACTION` of the median distance
  between fp32 seeds at that step; steps an optimizer skipped in the AMP run are skipped in the
  fp32 reference too (its update undone). A run the precision did not change (bitwise the fp32
  run) is INCONCLUSIVE: the code ignored what it was handed.
* **overflow**, for recipes that scale the loss: in a run of its own per optimizer, a non-finite
  gradient element is planted in that optimizer's gradients as a GradScaler unscales them; that
  optimizer must leave its parameters and state untouched, the others must take their step, and
  the scale must back off. An optimizer whose gradients never reach a GradScaler fails: its
  overflow would go unseen.
* **the module lane** (:mod:`harness.domains.engines.training.module_lane`) on the first AMP step.
* **determinism** (a rerun gives bitwise the same losses) and **resume** (saved mid-run through
  the objects' state dicts and continued in fresh objects, bitwise the uninterrupted run).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from harness.domains.engines.training import module_lane as ML
from harness.domains.engines.training.parity import MIN_TAKEN_SHARE, PARITY_FRACTION
from harness.domains.engines.training.recipes import Recipe
from harness.domains.training.user_step import (
    CodeRaised,
    Found,
    Plant,
    Precision,
    Program,
    StepProgram,
    Trace,
    precision_of,
    resumed,
    trace,
    trace_resumed,
)
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import format_of
from harness.platform.compat import force_eager


@dataclass(frozen=True)
class StepBand:
    """Per loss and step, the median distance between two fp32 seeds' losses."""

    per_step: dict[str, list[float]]
    seeds: int


def band_of(runs: Sequence[Trace]) -> StepBand:
    if len(runs) < 2:
        raise ValueError(f"a seed band needs at least 2 seeds, got {len(runs)}")
    names = runs[0].names
    pairs = list(itertools.combinations(runs, 2))
    return StepBand(
        {
            n: [
                statistics.median(abs(a.curve(n)[t] - b.curve(n)[t]) for a, b in pairs)
                for t in range(len(runs[0].losses))
            ]
            for n in names
        },
        len(runs),
    )


def skipped_steps(run: Trace, reference: Trace | None = None) -> dict[int, list[str]]:
    """Step -> the optimizers that skipped it in ``run``; with ``reference`` (the fp32 run of the
    same code), only the steps at which the reference's optimizer stepped: a step that accumulates
    gradients without stepping (every micro-batch but the last of a group) skips in both, and is
    no skip of the recipe's."""
    out: dict[int, list[str]] = {}
    for name in run.stepped:
        took = None if reference is None else set(reference.stepped.get(name, []))
        for k in run.skipped(name):
            if took is None or k in took:
                out.setdefault(k, []).append(name)
    return out


def same_run(a: Trace, b: Trace) -> bool:
    """Bitwise the same losses and final weights."""
    if a.losses != b.losses or a.final.keys() != b.final.keys():
        return False
    return all(torch.equal(a.final[k], b.final[k]) for k in a.final)


def judge_parity(name: str, recipe: Recipe, loss: str, amp: Trace, ref: Trace, band: StepBand) -> ClaimComparison:
    """One loss's curve in the AMP run against the fp32 reference on the same seed."""
    metric = f"{name}.{recipe.metric_id}.{loss}.worst_diff_over_allowance"
    # the steps each optimizer took in the fp32 run of the same code: all of them, or one in every
    # accumulation group where the code accumulates gradients over micro-batches
    steps = {o: len(ref.stepped.get(o, [])) or len(ref.losses) for o in amp.stepped}
    taken = {o: len(amp.stepped[o]) for o in amp.stepped}
    short = {o: n for o, n in taken.items() if n < MIN_TAKEN_SHARE * steps[o]}
    if short:
        return compare_claim(
            metric,
            min(short.values()),
            False,
            f"a parity verdict needs each optimizer to take >= {MIN_TAKEN_SHARE:.0%} of the steps it takes in fp32",
            detail=(
                f"{name} / {recipe.name}: "
                + ", ".join(f"{o} took {n} of the {steps[o]} steps it takes in fp32" for o, n in sorted(short.items()))
                + (f" (scale {amp.scales[0]:g} -> {amp.scales[-1]:g})" if amp.scales else "")
                + ": this tested nothing; train longer, or start the scaler lower",
            ),
            expected=MIN_TAKEN_SHARE * min(steps[o] for o in short),
            unit="steps",
            inconclusive=True,
        )
    if same_run(amp, ref):
        return compare_claim(
            metric,
            0.0,
            False,
            "the AMP run differs from the fp32 run (else the precision it was handed had no effect)",
            detail=(
                f"{name} / {recipe.name}: the run is bitwise the fp32 run (every loss, every final weight): the code "
                "ignored the precision it was handed (no autocast around the forward, or a trainer that does not "
                "apply this precision on this device), so nothing about AMP was tested",
            ),
            unit="",
            inconclusive=True,
        )
    a, r, allowed = amp.curve(loss), ref.curve(loss), band.per_step.get(loss, [])
    diffs = [abs(x - y) if math.isfinite(x) else math.inf for x, y in zip(a, r, strict=True)]
    allowances = [PARITY_FRACTION * b for b in allowed]
    ratios = [d / al if al > 0 else (math.inf if d > 0 else 0.0) for d, al in zip(diffs, allowances, strict=True)]
    worst = max(ratios, default=0.0)
    return compare_claim(
        metric,
        worst,
        worst <= 1.0,
        f"|L_amp - L_fp32| of {loss!r} at every step <= {PARITY_FRACTION} x the fp32 seed band (median pairwise "
        f"distance of {band.seeds} seeds at that step)",
        detail=(
            f"{name} / {recipe.name}: {loss!r} moved more than {PARITY_FRACTION} x the fp32 seed spread "
            f"(steps skipped by an optimizer, replayed on the reference: {skipped_steps(amp) or 'none'}):",
            *[
                f"step {t}: |diff| {d:.4g} > allowance {al:.4g}"
                for t, (d, al) in enumerate(zip(diffs, allowances, strict=True))
                if not d <= al
            ][:8],
        ),
        allowance=1.0,
    )


def judge_overflow(name: str, recipe: Recipe, optimizer: str, at: int, run: Trace) -> ClaimComparison:
    """One optimizer's planted overflow: it skipped (untouched, finite), the others stepped, the scale backed off."""
    seen = run.planted
    problems: list[str] = []
    broken = sorted(n for n, ok in (seen.finite_before if seen else {}).items() if not ok)
    if seen is None:
        problems.append("the planted step never ran")
    elif broken:
        problems.append(
            f"the parameters of {', '.join(broken)} were already non-finite when the planted step began: an earlier "
            "overflow (the scaler's own, from its initial scale) was stepped through"
        )
    else:
        if not seen.reached:
            problems.append(
                f"{optimizer}'s gradients never went through a GradScaler (no unscale_ or scaler.step for it): an "
                "overflow in them is not caught"
            )
        elif seen.changed.get(optimizer):
            problems.append(
                f"{optimizer} changed its parameters or state on the step with a non-finite gradient (its "
                "overflow was ignored"
                + ("" if seen.finite.get(optimizer, True) else "; its parameters are no longer finite")
                + ")"
            )
        for other, changed in sorted(seen.changed.items()):
            if other != optimizer and not changed:
                problems.append(f"{other} skipped its step although only {optimizer}'s gradients overflowed")
            if other != optimizer and not seen.finite.get(other, True):
                problems.append(f"{other}'s parameters are no longer finite")
        if seen.scale_before is not None and seen.scale_after is not None and not seen.scale_after < seen.scale_before:
            problems.append(f"the loss scale did not back off ({seen.scale_before:g} -> {seen.scale_after:g})")
    return compare_claim(
        f"{name}.{recipe.metric_id}.overflow.{optimizer}",
        len(problems),
        not problems,
        f"with a non-finite gradient planted in {optimizer}'s gradients, {optimizer} skips its step (parameters "
        "and state untouched), every other optimizer steps, and the scale backs off",
        detail=(f"{name} / {recipe.name}, overflow planted in {optimizer} at step {at}:", *problems),
        expected=0,
        allowance=0,
        unit="problems",
    )


def plant_step(run: Trace) -> int:
    """The step overflow is planted at: the first from the middle on that every optimizer took in
    the clean run (a step the scaler skipped anyway would show nothing)."""
    skipped = skipped_steps(run)
    middle = len(run.losses) // 2
    return next((k for k in range(middle, len(run.losses)) if k not in skipped), middle)


def judge_master_weights(name: str, recipe: Recipe, amp: Trace, ref: Trace) -> ClaimComparison:
    """Under autocast the trained parameters keep the fp32 run's dtypes (fp32 master weights)."""
    moved = {
        p: (ref.param_dtypes[p], d)
        for p, d in amp.param_dtypes.items()
        if p in ref.param_dtypes and ref.param_dtypes[p] != d
    }
    return compare_claim(
        f"{name}.{recipe.metric_id}.params_not_in_fp32_dtype",
        len(moved),
        not moved,
        "under an autocast recipe every trained parameter keeps the dtype it has in the fp32 run (the optimizer "
        "updates fp32 master weights; autocast casts copies)",
        detail=(
            f"{name} / {recipe.name}: {len(moved)} of {len(amp.param_dtypes)} parameters trained in another dtype "
            "than in fp32 (no fp32 master weights: small updates round away): "
            + ", ".join(f"{p} {a} -> {b}" for p, (a, b) in list(moved.items())[:4]),
        ),
        expected=0,
        allowance=0,
        unit="parameters",
    )


#: loss dtypes that round a loss's value and gradient to a low-precision format
LOW_LOSS_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2)


def judge_loss_precision(name: str, recipe: Recipe, amp: Trace) -> ClaimComparison | None:
    """Under an autocast recipe every loss the code returns is computed in fp32 or wider: autocast
    runs the losses (cross_entropy, mse_loss, nll_loss, log_softmax ...) in float32, so a loss in
    bf16 was computed outside autocast on low-precision logits, its value and gradient rounded to
    8 bits. Parity over a short run cannot see it (the rounding is far inside the seed band). None
    where the code returns its losses as numbers (no dtype to judge)."""
    if recipe.dtype is None or not amp.loss_dtypes:
        return None
    low = {
        k: sorted(str(d).removeprefix("torch.") for d in ds if d in LOW_LOSS_DTYPES)
        for k, ds in amp.loss_dtypes.items()
    }
    low = {k: v for k, v in low.items() if v}
    sizes = {k: _float64_error(amp.loss_float64.get(k, []), v) for k, v in low.items()}
    return compare_claim(
        f"{name}.{recipe.metric_id}.losses_in_low_precision",
        len(low),
        not low,
        "every loss the code returns under autocast is computed in float32 or wider (autocast's fp32 list holds the "
        "losses: a loss in bf16 or fp16 rounds its value and its gradient to the low-precision format)",
        detail=(
            f"{name} / {recipe.name}: "
            + (
                "; ".join(f"loss {k!r} returned in {', '.join(v)}{sizes[k]}" for k, v in sorted(low.items()))
                + ": computed outside autocast on low-precision outputs (e.g. a cross-entropy of bf16 logits); "
                "compute it under autocast, or on .float() outputs"
                if low
                else f"losses {sorted(amp.loss_dtypes)} in float32 or wider"
            ),
        ),
        expected=0,
        allowance=0,
        unit="losses",
    )


def _float64_error(pairs: Sequence[tuple[float, float]], dtypes: Sequence[str]) -> str:
    """The worst relative error of a loss against its float64 recomputation, in units of the
    widest low-precision dtype's unit roundoff ("" where the harness could not recompute it)."""
    if not pairs:
        return ""
    worst = max(abs(got - ref) / abs(ref) if ref else abs(got) for got, ref in pairs)
    u = max(format_of(getattr(torch, d)).unit_roundoff for d in dtypes)
    return f" (worst relative error against the same loss from float64 inputs: {worst:.3g}, {worst / u:.3g} u of {dtypes[0]})"


#: the parameter dtypes an fp32 reference run may train (anything narrower is no fp32 reference)
REFERENCE_DTYPES = (torch.float32, torch.float64)


def judge_reference(name: str, recipe: Recipe, ref: Trace) -> ClaimComparison | None:
    """None when the fp32 reference run trains fp32 (or wider) parameters (those an optimizer of the
    code steps: a frozen bf16 teacher is no part of it); else the FAIL saying that there is no fp32
    reference, naming the parameters that are low-precision in it (a model
    built or cast in bf16 before the code was handed a precision: comparing the AMP run with it
    would hold one low-precision run to another)."""
    low = {p: d for p, d in ref.param_dtypes.items() if p in ref.trained and d not in REFERENCE_DTYPES}
    if not low:
        return None
    return compare_claim(
        f"{name}.{recipe.metric_id}.fp32_reference_params_not_fp32",
        len(low),
        False,
        "the fp32 reference run trains fp32 parameters (else there is no fp32 reference to judge the recipe against)",
        detail=(
            f"{name} / {recipe.name}: no fp32 reference: {len(low)} of {len(ref.trained)} trained parameters are "
            f"{', '.join(sorted({str(d).removeprefix('torch.') for d in low.values()}))} in the run handed fp32 "
            f"(the model is built or cast in low precision before the precision applies): "
            + ", ".join(f"{p} {str(d).removeprefix('torch.')}" for p, d in list(low.items())[:4])
            + (f" ... {len(low) - 4} more" if len(low) > 4 else ""),
        ),
        expected=0,
        allowance=0,
        unit="parameters",
    )


def judge_determinism(name: str, recipe: Recipe, a: Trace, b: Trace) -> ClaimComparison:
    def same(x: dict[str, float], y: dict[str, float]) -> bool:
        return x.keys() == y.keys() and all(x[k] == y[k] or (math.isnan(x[k]) and math.isnan(y[k])) for k in x)

    first = next((t for t, (x, y) in enumerate(zip(a.losses, b.losses, strict=True)) if not same(x, y)), None)
    return compare_claim(
        f"{name}.{recipe.metric_id}.deterministic",
        first is None,
        first is None,
        "a rerun gives bitwise-identical losses",
        detail=(f"nondeterministic: {name} / {recipe.name} gave different losses from step {first} on a rerun",),
    )


def judge_resume(
    name: str,
    recipe: Recipe,
    at: int,
    whole: Trace,
    back: Trace,
    how: str,
) -> ClaimComparison:
    """The resumed run against the uninterrupted one, bit for bit; ``how`` it was saved and loaded."""
    metric = f"{name}.{recipe.metric_id}.resume_differences"
    diffs = []
    if len(back.losses) != len(whole.losses):
        diffs.append(f"the resumed run took {len(back.losses)} steps in all, the uninterrupted one {len(whole.losses)}")
    if whole.scales != back.scales:  # first: a scale left behind explains the losses that follow
        diffs.append(f"scales {whole.scales[at : at + 3]} != {back.scales[at : at + 3]} (from step {at})")
    for t, (x, y) in enumerate(zip(whole.losses, back.losses, strict=False)):  # lengths: judged above
        if x != y:
            diffs.append(f"step {t} losses {x} != {y}")
    for m in whole.final:
        if m not in back.final or not torch.equal(whole.final[m], back.final[m]):
            diffs.append(f"final weights of {m}")
    return compare_claim(
        metric,
        len(diffs),
        not diffs,
        f"saved before step {at} {how} and loaded into fresh objects, the run continues bit for bit",
        detail=(
            f"{name} / {recipe.name} resumed before step {at} parts from the uninterrupted run: "
            + " | ".join(diffs[:4]),
        ),
        expected=0,
        allowance=0,
        unit="differences",
    )


def scaler_contract_violations(run: Trace) -> list[str]:
    """Where the code broke GradScaler's contract, step by step: ``update()`` once per iteration in
    which the scaler stepped an optimizer, after every such ``step`` (PyTorch's AMP examples: "a
    single update() per iteration, after all optimizers used this iteration have been stepped");
    ``unscale_`` at most once per optimizer and before its ``step`` (torch's own scaler raises on
    both; a scaler of the code's own may not); and the scale each iteration leaves equal to the reference state machine's (back off on a
    non-finite gradient, grow after ``growth_interval`` clean iterations) fed the same found-inf."""
    out: list[str] = []
    scale: float | None = None
    tracker = 0
    for k in sorted(run.scaler_calls):
        calls = run.scaler_calls[k]
        steps = [i for i, c in enumerate(calls) if c.kind == "step"]
        updates = [i for i, c in enumerate(calls) if c.kind == "update"]
        if steps and len(updates) != 1:
            callers = sorted({calls[i].caller for i in updates if calls[i].caller})
            out.append(
                f"step {k}: update() called {len(updates)} times in an iteration whose scaler stepped "
                f"{', '.join(calls[i].optimizer for i in steps)} (once per iteration, after every optimizer's step)"
                + (f"; update() called from {', '.join(callers)}" if callers else "")
            )
        for opt in dict.fromkeys(c.optimizer for c in calls if c.kind == "unscale_"):
            at = [i for i, c in enumerate(calls) if c.kind == "unscale_" and c.optimizer == opt]
            stepped = [i for i, c in enumerate(calls) if c.kind == "step" and c.optimizer == opt]
            if len(at) > 1:
                out.append(f"step {k}: unscale_({opt}) called {len(at)} times (at most once per optimizer per step)")
            if stepped and at[-1] > stepped[0]:
                out.append(f"step {k}: unscale_({opt}) after scaler.step({opt}) (unscale_ comes before step)")
        for i in steps:  # a step after an update is at a moved scale unless its loss was scaled after it
            before = [u for u in updates if u < i]
            if before and not any(c.kind == "scale" for c in calls[before[-1] + 1 : i]):
                out.append(
                    f"step {k}: scaler.step({calls[i].optimizer}) after update() with no scale() between: its "
                    "gradients were scaled at the scale the update then moved"
                )
                break
        done = [calls[i] for i in updates]
        if not done or any(c.explicit for c in done):
            scale = None  # the code set the scale itself (or took no scaled step): start again from what it is
            continue
        found = any(c.found_inf for c in done)
        growth, backoff, interval = done[0].growth
        if scale is None:
            scale, tracker = done[0].scale_before, 0
        if found:
            scale, tracker = scale * backoff, 0
        else:
            tracker += 1
            if tracker == interval:
                scale, tracker = scale * growth, 0
        seen = done[-1].scale_after
        if seen != scale:
            out.append(
                f"step {k}: the scale after the iteration is {seen:g}; the reference state machine fed this "
                f"iteration's {'non-finite' if found else 'finite'} gradients gives {scale:g}"
            )
            scale, tracker = seen, 0
    return out


def judge_scaler_contract(name: str, recipe: Recipe, run: Trace) -> ClaimComparison:
    """The code used GradScaler as its contract says, every step (:func:`scaler_contract_violations`)."""
    found = scaler_contract_violations(run)
    return compare_claim(
        f"{name}.{recipe.metric_id}.scaler_contract",
        len(found),
        not found,
        "GradScaler: update() once per iteration, after every optimizer it stepped; the scale each iteration "
        "leaves is the reference state machine's fed that iteration's found-inf",
        detail=tuple(found[:5]) + ((f"... {len(found) - 5} more",) if len(found) > 5 else ()) or ("no violation",),
        expected=0,
        allowance=0,
        unit="violations",
    )


@dataclass
class Judged:
    """One verdict and what the caller records with it."""

    kind: str
    recipe: str
    comparison: ClaimComparison
    tags: dict[str, object]


def judge_precision(name: str, recipe: Recipe, seen: set[torch.dtype]) -> ClaimComparison:
    """The code's modules ran under autocast in the dtype the recipe names (a trainer that swaps
    fp16 for bf16, or never enables autocast, tested another recipe than the one asked for)."""
    wanted = recipe.dtype
    ok = seen == {wanted}
    return compare_claim(
        f"{name}.{recipe.metric_id}.autocast_dtype_applied",
        ok,
        ok,
        f"the models' modules run under autocast in {wanted} (the recipe's dtype) in the first AMP step",
        detail=(
            f"{name} / {recipe.name}: "
            + (
                f"modules ran under autocast in {', '.join(sorted(str(d) for d in seen))}, not {wanted}: the code (or "
                "its trainer) applied another precision than the one it was handed, so this recipe was not tested"
                if seen
                else "no module ran under autocast: the code (or its trainer) ignored the precision it was handed"
            ),
        ),
        inconclusive=True,
    )


def _lane_observer(
    recipe: Recipe,
    device: torch.device,
    fp32_modules: Sequence[str],
    into: list[list[ML.RegionError]],
    dtypes: set[torch.dtype],
) -> Callable[[int, Found], contextlib.AbstractContextManager[object]]:
    @contextlib.contextmanager
    def observe(step: int, found: Found) -> Iterator[object]:
        if step != 0 or not found.models or recipe.dtype is None:
            yield None
            return
        observer = ML.Observer(found.models, device.type, fp32_modules)
        with observer, force_eager():
            yield observer
        dtypes.update(observer.autocast_dtypes)
        into.append(observer.errors(recipe.dtype))

    return observe


def judge_all(
    program: Program,
    recipes: Sequence[Recipe],
    device: torch.device,
    seeds: int,
    *,
    overflow: bool = True,
    determinism: bool = True,
    module_lane: bool = True,
    resume_at: int | None = None,
    fp32_modules: Sequence[str] = (),
    init_scale: float | None = None,
) -> Iterator[Judged]:
    """Every verdict on ``program`` under ``recipes``, as it is decided."""
    name = program.name

    def make(recipe: Recipe | None) -> Callable[[], Precision]:
        return lambda: precision_of(recipe, device, init_scale)

    try:
        fp32 = [trace(program, s, make(None)()) for s in range(seeds)]
    except CodeRaised as raised:  # the code fails without any recipe: its own error, as it raised it
        raise raised.error from None
    if not fp32[0].losses:
        raise ValueError(f"{name}: the run took no step (no batches, or begin/end never called)")
    if not fp32[0].found:
        raise ValueError(
            f"{name}: no model or optimizer among the objects the code trains: the harness watches the run through "
            "them (which optimizer stepped, parameters, state); return them in a dict, list, tuple, dataclass or "
            "object with attributes"
        )
    band = band_of(fp32)
    for recipe in recipes:
        try:
            yield from _judge_recipe(
                program, recipe, device, fp32, band, make, overflow, determinism, module_lane, resume_at, fp32_modules
            )
        except CodeRaised as raised:
            yield Judged("raised", recipe.name, judge_raised(name, recipe, raised), {"step": raised.step})


def judge_raised(name: str, recipe: Recipe, raised: CodeRaised) -> ClaimComparison:
    """The code raised under ``recipe``: the recipe's verdict, naming the step and the exception."""
    return compare_claim(
        f"{name}.{recipe.metric_id}.code_raised",
        1,
        False,
        "the code trains under the recipe without raising",
        detail=(f"{name} / {recipe.name}: {raised}",),
        expected=0,
        allowance=0,
        unit="exceptions",
    )


def _judge_recipe(
    program: Program,
    recipe: Recipe,
    device: torch.device,
    fp32: list[Trace],
    band: StepBand,
    make: Callable[[Recipe | None], Callable[[], Precision]],
    overflow: bool,
    determinism: bool,
    module_lane: bool,
    resume_at: int | None,
    fp32_modules: Sequence[str],
) -> Iterator[Judged]:
    """Every verdict on one recipe, as it is decided (the fp32 runs and their band given)."""
    name = program.name
    regions: list[list[ML.RegionError]] = []
    dtypes: set[torch.dtype] = set()
    observe = _lane_observer(recipe, device, fp32_modules, regions, dtypes)
    amp = trace(program, 0, make(recipe)(), observe=observe)
    skips = skipped_steps(amp, fp32[0])
    ref = trace(program, 0, make(None)(), undo=skips) if skips else fp32[0]
    applied = judge_precision(name, recipe, dtypes)
    yield Judged("precision", recipe.name, applied, {"autocast_dtypes": sorted(str(d) for d in dtypes)})
    loss_precision = judge_loss_precision(name, recipe, amp)
    if loss_precision is not None and applied.passed:
        yield Judged(
            "loss_precision",
            recipe.name,
            loss_precision,
            {"loss_dtypes": {k: sorted(map(str, v)) for k, v in amp.loss_dtypes.items()}},
        )
    no_reference = judge_reference(name, recipe, fp32[0])
    if no_reference is not None:
        # parity against a low-precision "reference" would hold one low-precision run to another
        yield Judged("master_weights", recipe.name, no_reference, {"reference": "fp32 run, low-precision parameters"})
        return
    if not applied.passed or same_run(amp, ref):
        # what follows would judge another recipe (or fp32) under this one's name
        if applied.passed:
            yield Judged("parity", recipe.name, judge_parity(name, recipe, amp.names[0], amp, ref, band), {})
        return
    for loss in amp.names:
        yield Judged(
            "parity",
            recipe.name,
            judge_parity(name, recipe, loss, amp, ref, band),
            {"loss": loss, "skipped": {k: v for k, v in skips.items()}, "steps": len(amp.losses)},
        )
    yield Judged("master_weights", recipe.name, judge_master_weights(name, recipe, amp, ref), {})
    if regions and module_lane:
        errors = regions[0]
        yield Judged(
            "module_lane",
            recipe.name,
            ML.judge(name, recipe.metric_id, errors),
            ML.tags(errors),
        )
    scaled = bool(amp.scales)
    if any(c.kind == "step" for calls in amp.scaler_calls.values() for c in calls):
        yield Judged("scaler_contract", recipe.name, judge_scaler_contract(name, recipe, amp), {})
    if overflow and scaled:
        at = plant_step(amp)
        for opt in sorted(amp.stepped):
            planted = trace(program, 0, make(recipe)(), plant=Plant(opt, at))
            yield Judged(
                "overflow",
                recipe.name,
                judge_overflow(name, recipe, opt, at, planted),
                {"step": at, "optimizer": opt},
            )
    if determinism:
        again = trace(program, 0, make(recipe)())
        yield Judged("determinism", recipe.name, judge_determinism(name, recipe, amp, again), {})
    if resume_at is not None:
        if isinstance(program, StepProgram) or (program.resumable is None and hasattr(program, "run_resumed")):
            if isinstance(program, StepProgram):
                back = resumed(program, 0, make(recipe), resume_at)
                how = "through the objects' state dicts (with the scaler and torch's RNG)"
            else:
                back = trace_resumed(program, 0, make(recipe)(), resume_at)
                how = "through the trainer's own checkpoint"
            whole = trace(program, 0, make(recipe)())
            verdict = judge_resume(name, recipe, resume_at, whole, back, how)
            yield Judged("resume", recipe.name, verdict, {"at": resume_at})
        else:
            yield Judged(
                "resume",
                recipe.name,
                compare_claim(
                    f"{name}.{recipe.metric_id}.resume_differences",
                    math.nan,
                    False,
                    "saved mid-run and resumed, the run continues bit for bit",
                    detail=(
                        f"{name}: {program.resumable or 'the program has no run_resumed(seed, precision, loop, at)'}",
                    ),
                    inconclusive=True,
                ),
                {},
            )


def validate_program(program: object, seeds: object, resume_at: object) -> None:
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ValueError(f"seeds={seeds!r}: the parity band is the spread between fp32 seeds and needs at least 2")
    if resume_at is not None and (isinstance(resume_at, bool) or not isinstance(resume_at, int) or resume_at < 1):
        raise ValueError(f"resume_at={resume_at!r}: the step before which the run is saved (at least 1)")
    if isinstance(program, StepProgram) and resume_at is not None and resume_at >= len(program.data(0)):
        raise ValueError(f"resume_at={resume_at}: must be before the last of {len(program.data(0))} steps")
