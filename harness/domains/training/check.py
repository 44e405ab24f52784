"""Bring your own model: the training checks of a user's ``Setup`` (parity, the AMP lane with its
positive controls, determinism, the gradient census, overflow handling), driven here in the
training domain so that following a user's setup never leaves it. What a verdict becomes is the
caller's: every row goes through a :class:`RowRecorder` (in a pytest test the plugin's
``amp_record``; in plain Python any object with those three methods), so this module knows no
pytest and no files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from harness.domains.engines.rows import RowRecorder
from harness.domains.engines.training import amp_lane as L
from harness.domains.engines.training import module_lane as ML
from harness.domains.engines.training import overflow as O
from harness.domains.engines.training.diagnosis import Diagnosis, diagnose, first_over_budget, localise, localised
from harness.domains.engines.training.loop import resume_differences, train
from harness.domains.engines.training.parity import (
    DEFAULT_SEEDS,
    Band,
    ParityReport,
    RecipeResult,
    check_parity,
    is_deterministic,
    judge_clipping,
    judge_determinism,
    validate,
)
from harness.domains.engines.training.parity import judge as judge_parity
from harness.domains.engines.training.recipes import Recipe, Setup
from harness.domains.op_prints import OpPrint
from harness.domains.training import recompute as RC
from harness.domains.training import repro as training_repro
from harness.domains.training.census import fp32_gradients, gradient_census
from harness.domains.training.repro import op_repro_of
from harness.domains.training.result import Checked, Kind, TrainingCheckFailed, TrainingResult
from harness.domains.training.step_checks import judge_all, validate_program
from harness.domains.training.user_step import Program, StepProgram, validate_recipes
from harness.numerics.comparison import AnyComparison, compare_claim, explain
from harness.numerics.verdict import Outcome


class TrainingChecks:
    """Bring your own model: parity, the AMP lane, determinism and gradient census of the training suite.

    Example::

        def test_my_model(amp_training):
            setup = harness.api.Setup("mine", model, batch, loss, steps=20, lr=1e-3)
            amp_training.check(setup, [harness.api.BF16, harness.api.FP16_SCALER])

    Every verdict comes from :mod:`harness.domains.training` (the same functions the training
    suite uses); this object only records them and fails the test with every miss. A failed
    parity verdict is diagnosed (:mod:`harness.domains.engines.training.diagnosis`): the module where the
    AMP run departs from fp32 is named in the message and recorded.
    """

    def __init__(self, recorder: RowRecorder, device: torch.device) -> None:
        self._record, self._device = recorder, device
        #: while :meth:`check` runs: the verdicts, diagnoses and notes it collects
        self._collected: list[Checked] | None = None
        self._diagnoses: dict[str, Diagnosis] = {}
        self._notes: dict[tuple[Kind, str], str] = {}

    def _judged(self, kind: Kind, recipe: str, comparison: AnyComparison, **row: Any) -> bool:
        """Record one verdict as a row (and, inside :meth:`check`, keep it for the result)."""
        if self._collected is not None:
            self._collected.append(Checked(kind, recipe, comparison))
        return self._record.result(comparison, **row)

    @property
    def device(self) -> torch.device:
        """Where the checks train."""
        return self._device

    def on(self, device: str | torch.device) -> TrainingChecks:
        """The same checks on another device: ``amp_training.on("cuda:1").check(setup, [BF16])``."""
        return TrainingChecks(self._record, torch.device(device))

    def parity_verdict(
        self, setup: Setup, result: RecipeResult, band: Band, tags: dict[str, Any] | None = None
    ) -> str | None:
        """Record one recipe's parity verdict (and, when it fails, its diagnosis); the failure
        message, or None when it passed."""
        verdict = judge_parity(setup.name, result)
        recipe = result.recipe.name
        base = {
            "control": result.recipe.control,
            "skipped_steps": result.run.skipped_at,
            "taken_steps": result.run.taken_steps,
            "steps": len(result.run.losses),
            "param_change": result.reference.param_change,
            **(tags or {}),
        }
        dtype = str(result.recipe.dtype or "float32")
        clipping = judge_clipping(setup.name, result)
        unclipped = None
        if clipping is not None and not self._judged(
            Kind.CLIPPING, recipe, clipping, device=self._device, dtype=dtype, tags={"norms": result.run.clip_norms}
        ):
            unclipped = explain(clipping)
        # a failed AMP recipe keeps its whole run as a script (the built-in models; the step's first
        # op over its budget, when the diagnosis finds one, keeps its own)
        failed = verdict.outcome is Outcome.FAIL and not result.recipe.control
        run_script = training_repro.repro_of(setup, result.recipe, band, self._device) if failed else None
        if self._judged(Kind.PARITY, recipe, verdict, device=self._device, dtype=dtype, tags=base, repro=run_script):
            return unclipped
        message = explain(verdict) if unclipped is None else f"{explain(verdict)}\n{unclipped}"
        if failed:
            try:
                diagnosis = diagnose(setup, result, band, self._device)
            except Exception as exc:  # the verdict stands; a diagnosis that cannot run must not hide it
                message += f"\n(no diagnosis: {type(exc).__name__}: {exc})"
            else:
                self._record_diagnosis(setup, result, diagnosis, dtype)
                self._diagnoses[recipe] = diagnosis
                message += "\n" + diagnosis.explain()
        return message

    def _record_diagnosis(self, setup: Setup, result: RecipeResult, d: Diagnosis, dtype: str) -> None:
        u = d.unit_roundoff
        metric = f"{setup.name}.{result.recipe.metric_id}.diagnosis"
        if d.departure is not None:
            self._record(
                f"{metric}.departure_own_error",
                (d.departure.local or 0.0) / u,
                unit="u",
                device=self._device,
                dtype=dtype,
                tags={
                    "module": d.departure.name,
                    "kind": d.departure.kind,
                    "step": d.step,
                    "output_error": d.departure.forward,
                    "ranked": [(m.name, m.kind, (m.local or 0.0) / u) for m in d.ranked()],
                },
                note="the module with the largest error of its own (local error in units of the autocast dtype's u)",
            )
        if d.first_op is not None:
            self._record_first_op(f"{metric}.first_op_over_budget", d.first_op)
        if d.remedy is not None:
            self._record(
                f"{metric}.remedy_worst_over_allowance",
                d.remedy.worst_after,
                expected=1.0,
                device=self._device,
                dtype=dtype,
                tags={"module_in_fp32": d.remedy.module, "before": d.remedy.worst_before, "fixes": d.remedy.fixes},
                note=f"parity with {d.remedy.module} outside autocast (before: {d.remedy.worst_before:.3g})",
            )

    def lane_verdicts(
        self, setup: Setup, report: ParityReport, underflow_share: float | None = None, power: bool = True
    ) -> list[str]:
        """The AMP lane of every recipe of ``report`` (its runs kept their states), after the
        canonical broken recipes were tried from the same states: a PASS on a setup where the lane
        cannot see one of them is INCONCLUSIVE (``power=False``: the controls are not tried).
        Records rows; returns the failure messages."""
        failures: list[str] = []
        # a reference is the exact and correctly rounded steps from one run's states: never shared
        # between two recipes' runs of the same dtype (each trained to states of its own)
        references_of: dict[int, dict[torch.dtype, L.LaneReference]] = {}
        for r in report.results:
            dtype = L.lane_dtype(r.recipe)
            if dtype is None or not r.run.states:
                continue
            references = references_of.setdefault(id(r.run), {})
            if dtype not in references:
                references[dtype] = L.lane_reference(setup, r.run, dtype, r.recipe, self._device)
            lane = L.amp_lane(setup, r.recipe, r.run, references[dtype], self._device)
            blind: list[L.Control] = []
            if power and not r.recipe.control:
                for control in L.power(setup, r.recipe, r.run, references, self._device, underflow_share):
                    self._judged(
                        Kind.POWER,
                        r.recipe.name,
                        L.judge_control(setup.name, control),
                        device=self._device,
                        dtype=str(L.lane_dtype(control.recipe)),
                        tags={"for_recipe": r.recipe.name, "per_step": [e.ratio for e in control.lane.errors]},
                        comparable=False,
                    )
                    if not control.caught:
                        blind.append(control)
            verdict = L.judge_lane(lane, control=r.recipe.control, blind=blind)
            localised, script = "", None
            if verdict.outcome is Outcome.FAIL and not r.recipe.control:
                localised = self._first_op(setup, r.recipe, "lane")
                self._notes[(Kind.LANE, r.recipe.name)] = localised.lstrip("\n")
                # the judged steps themselves, from the states saved beside the script
                script = training_repro.lane_repro_of(
                    setup, r.recipe, r.run, [e.step for e in lane.errors], self._device
                )
            tags = {
                "per_step": [(e.step + 1, e.amp, e.emulated) for e in lane.errors],
                "left_out": list(lane.left_out),
                "emulated_calls": lane.calls,
                "attention_kernel_ratio": lane.kernel_ratio,
                "control": r.recipe.control,
            }
            if not self._judged(
                Kind.LANE, r.recipe.name, verdict, device=self._device, dtype=str(dtype), tags=tags, repro=script
            ):
                failures.append(explain(verdict) + localised)
            if lane.kernel_ratio is not None:
                self._record(
                    f"{setup.name}.{r.recipe.metric_id}.amp_lane_attention_kernel_ratio",
                    lane.kernel_ratio,
                    unit="x",
                    device=self._device,
                    dtype=str(dtype),
                    comparable=False,
                    note="the lane's ratio with the stack's own attention kernel instead of a correctly rounded one "
                    "(information: the op numerics suite holds the kernel to its budget)",
                )
        return failures

    def _first_op(self, setup: Setup, recipe: Recipe, rule: str) -> str:
        """For a failed verdict: the first aten op of one AMP step whose own error against float64
        leaves its budget (a row, and a line for the message; "" where every op stays within it)."""
        try:
            ops = localise(setup, recipe, None, self._device)
        except Exception as exc:  # the verdict stands; a localisation that cannot run must not hide it
            return f"\n  (no op localisation: {type(exc).__name__}: {exc})"
        o = first_over_budget(ops)
        if o is not None:
            self._record_first_op(f"{setup.name}.{recipe.metric_id}.{rule}.first_op_over_budget", o)
        return f"\n  {localised(o, len(ops))}"

    def _record_first_op(self, metric: str, o: OpPrint) -> None:
        """The row of the first aten op of an AMP step whose own error leaves its budget."""
        repro = op_repro_of(o, self._device)
        self._record(
            metric,
            o.error_u,
            unit="u",
            allowance=o.budget_u,
            device=self._device,
            dtype=o.dtype,
            tags={
                "op": f"aten.{o.op}",
                "module": o.module,
                "index": o.index,
                "shape": list(o.shape),
                **self._record.repro_tags(repro),
            },
            note="the first aten op of one AMP step whose own error against float64 (same inputs) leaves its budget",
        )

    def detection_ladder(self, setup: Setup, recipe: Recipe, report: ParityReport) -> float | None:
        """The smallest relative gradient noise the AMP lane catches on ``setup`` (one row per level
        and one for the limit): what the rules can see on your model. About a lane's cost per level."""
        result = next((r for r in report.results if r.recipe == recipe), None)
        dtype = L.lane_dtype(recipe)
        if result is None or dtype is None:
            raise ValueError(f"recipe {recipe.name!r} is not a low-precision recipe of this report")
        reference = L.lane_reference(setup, result.run, dtype, recipe, self._device)
        lanes = L.ladder_lanes(setup, recipe, result.run, reference, L.POWER_LADDER, self._device)
        limit = L.detection_limit(lanes)
        for level, lane in lanes.items():
            self._record(
                f"{setup.name}.{recipe.metric_id}.power.noise_{level:.3g}",
                lane.ratio,
                allowance=L.LANE_FACTOR,
                unit="x",
                device=self._device,
                dtype=str(dtype),
                comparable=False,
                note="AMP lane ratio with this relative gradient noise injected into the recipe's steps",
            )
        self._record(
            f"{setup.name}.{recipe.metric_id}.power.detection_limit",
            limit if limit is not None else float("inf"),
            unit="relative gradient noise",
            device=self._device,
            dtype=str(dtype),
            comparable=False,
            note="the smallest injected gradient noise the AMP lane fails, every larger level failing too",
        )
        return limit

    def check(
        self,
        setup: Setup,
        recipes: Sequence[Recipe],
        seeds: int | None = None,
        determinism: bool = True,
        census: bool = True,
        lane: bool = True,
        power: bool = True,
        ladder: bool = False,
        overflow: bool = True,
        resume_at: int | None = None,
        recompute: bool = True,
        module_lane: bool = True,
        fp32_modules: Sequence[str] = (),
    ) -> TrainingResult:
        """Parity, the AMP lane with its positive controls, determinism, the gradient census and,
        for recipes with a loss scaler, overflow handling of ``recipes`` on ``setup``; returns a
        :class:`~harness.domains.training.result.TrainingResult` with every verdict, and fails the
        test with every miss by raising
        :class:`~harness.domains.training.result.TrainingCheckFailed` (an ``AssertionError``
        carrying the same result). Overflow handling (``overflow=False``: not tried) runs the recipe
        once more with a non-finite gradient element planted at checkpoint steps: your optimizer and
        scaler must leave parameters and optimizer state untouched there and back the scale off
        (:mod:`harness.domains.engines.training.overflow`). A recipe that passes on a setup
        where the lane does not see the canonical broken recipes (no fp32 master weights; for fp16,
        no loss scaling) is INCONCLUSIVE, naming them (``power=False``: not tried, for a setup whose
        power is shown otherwise).
        Activation checkpointing, however the model does it: every module whose forward runs again
        in the backward must recompute in the dtypes of its forward, or the module is named
        (:mod:`harness.domains.training.recompute`; ``recompute=False``: not looked at).
        ``resume_at=k`` also saves each recipe's run before step k (model, optimizer, schedule,
        scaler, torch's RNG and the data generator, through ``torch.save``), loads it into fresh
        objects and continues: the losses, scales, skipped steps and final weights must equal the
        uninterrupted run's bit for bit (two more runs per recipe).
        ``module_lane`` (on by default): each module's own error in one AMP step against what it
        owes, declared-fp32 regions (``custom_fwd(cast_inputs=torch.float32)``, autocast-disabled
        modules, ``fp32_modules`` by name) against fp32 (:mod:`harness.domains.engines.training.module_lane`).
        ``ladder=True`` also measures the smallest gradient noise the lane catches on this setup
        (a lane per noise level: about the cost of the lane again per level). A call that
        could only be vacuous (no recipes, a non-recipe, fewer than 2 seeds, too few checkpoints)
        is refused before anything trains."""
        __tracebackhide__ = True
        n = DEFAULT_SEEDS if seeds is None else seeds
        recipes = validate(setup, recipes, n)
        if resume_at is not None and not 0 < resume_at < setup.steps:
            raise ValueError(
                f"resume_at={resume_at!r}: the run must be saved before one of steps 1 to {setup.steps - 1} of "
                f"{setup.name!r} ({setup.steps} steps), so that it resumes mid-run"
            )
        collected: list[Checked] = []
        self._collected, self._diagnoses, self._notes = collected, {}, {}
        try:
            if recompute and self.recompute_verdicts(setup, recipes):
                raise TrainingCheckFailed(TrainingResult(setup.name, None, collected, notes=self._notes))
            counted: dict[str, float] | None = None
            underflow: float | None = None
            if census:
                c = gradient_census(fp32_gradients(setup, device=self._device))
                underflow = float(c["underflow_share"])
                counted = {"underflow_share": underflow, "subnormal_share": float(c["subnormal_share"])}
                self._record(
                    f"{setup.name}.grad.underflow_share", c["underflow_share"], unit="share", device=self._device
                )
                self._record(
                    f"{setup.name}.grad.subnormal_share", c["subnormal_share"], unit="share", device=self._device
                )
            report = check_parity(setup, recipes, seeds=n, device=self._device)
            result = TrainingResult(setup.name, report, collected, counted, self._diagnoses, notes=self._notes)
            for r in report.results:
                self.parity_verdict(setup, r, report.band)
            if lane:
                self.lane_verdicts(setup, report, underflow, power)
                if ladder:
                    for recipe in recipes:
                        result.detection_limits[recipe.name] = self.detection_ladder(setup, recipe, report)
            if module_lane:
                self.module_lane_verdicts(setup, recipes, fp32_modules)
            if overflow:
                self.overflow_verdicts(setup, recipes)
            if resume_at is not None:
                self.resume_verdicts(setup, recipes, resume_at)
            if determinism:
                for recipe in recipes:
                    same, first = is_deterministic(setup, recipe, self._device)
                    self._judged(
                        Kind.DETERMINISM,
                        recipe.name,
                        judge_determinism(setup.name, recipe, same, first),
                        device=self._device,
                    )
        finally:
            self._collected = None
        if result.failures:
            raise TrainingCheckFailed(result)
        return result

    def module_lane_verdicts(self, setup: Setup, recipes: Sequence[Recipe], fp32_modules: Sequence[str] = ()) -> None:
        """The module lane of each autocast recipe: one AMP step at the initial weights on the
        evaluation batch, every region judged on its own (:mod:`~harness.domains.engines.training.module_lane`)."""
        for recipe in recipes:
            if recipe.dtype is None or recipe.control:
                continue
            dtype = recipe.dtype
            errors = ML.of_setup(setup, dtype, self._device, fp32_modules)
            self._judged(
                Kind.MODULE_LANE,
                recipe.name,
                ML.judge(setup.name, recipe.metric_id, errors),
                device=self._device,
                dtype=str(dtype),
                tags=ML.tags(errors),
            )

    def check_step(
        self,
        build: Any,
        step: Any,
        recipes: Sequence[Recipe],
        *,
        batches: Any,
        name: str = "my_step",
        steps: int | None = None,
        **options: Any,
    ) -> TrainingResult:
        """Your own training step, judged as :meth:`check` judges a ``Setup``.

        Example::

            def build(seed):               # or build(seed, precision)
                g, d = Generator(), Discriminator()
                return {"gen": g, "disc": d, "opt_g": Adam(g.parameters()), "opt_d": Adam(d.parameters())}

            def step(objects, batch, precision):
                with precision.autocast():
                    d_loss = ...
                precision.scaler.scale(d_loss).backward()
                precision.scaler.step(objects["opt_d"])
                ...
                precision.scaler.update()
                return {"d_loss": d_loss, "g_loss": g_loss}

            amp_training.check_step(build, step, [BF16, FP16_SCALER], batches=batches, resume_at=8)

        ``batches``: a sequence, or ``batches(seed)``; every run of seed s calls
        ``torch.manual_seed(s)`` and ``build`` first. The options are :meth:`check_program`'s."""
        __tracebackhide__ = True
        program = StepProgram(name, build, step, batches, steps)
        return self.check_program(program, recipes, **options)

    def check_program(
        self,
        program: Program,
        recipes: Sequence[Recipe],
        *,
        seeds: int = DEFAULT_SEEDS,
        overflow: bool = True,
        determinism: bool = True,
        module_lane: bool = True,
        resume_at: int | None = None,
        fp32_modules: Sequence[str] = (),
        init_scale: float | None = None,
    ) -> TrainingResult:
        """A program (:class:`~harness.domains.training.user_step.StepProgram`, or a trainer's:
        ``HFTrainerProgram``, ``AccelerateProgram``, ``LightningProgram``) in fp32 over ``seeds`` and
        under each recipe: the precision it applied, parity of every loss it returns, fp32 master
        weights, the module lane, overflow planted in each optimizer (recipes with a scaler),
        determinism, and with ``resume_at`` a save and resume through the objects' state dicts
        (:mod:`harness.domains.training.step_checks`). Returns the verdicts; raises
        :class:`TrainingCheckFailed` with every miss."""
        __tracebackhide__ = True
        recipes = validate_recipes(recipes)
        validate_program(program, seeds, resume_at)
        collected: list[Checked] = []
        self._collected = collected
        try:
            for j in judge_all(
                program,
                recipes,
                self._device,
                seeds,
                overflow=overflow,
                determinism=determinism,
                module_lane=module_lane,
                resume_at=resume_at,
                fp32_modules=fp32_modules,
                init_scale=init_scale,
            ):
                dtype = next((str(r.dtype) for r in recipes if r.name == j.recipe), "")
                self._judged(Kind(j.kind), j.recipe, j.comparison, device=self._device, dtype=dtype, tags=j.tags)
        finally:
            self._collected = None
        result = TrainingResult(program.name, None, collected)
        if result.failures:
            raise TrainingCheckFailed(result)
        return result

    def recompute_verdicts(self, setup: Setup, recipes: Sequence[Recipe]) -> bool:
        """For each autocast recipe: the modules the backward recomputes, each in its forward's
        dtypes. Returns whether a recompute raised (then the recipe cannot train: the checks stop
        at this verdict rather than crash in the training runs)."""
        blocked = False
        for recipe in recipes:
            if recipe.dtype is None or recipe.control:
                continue
            seen = RC.observe(setup, recipe, self._device)
            eager = (
                f" (observed eager: {', '.join(repr(n) if n else 'the model' for n in seen.compiled)} compiled with "
                "torch.compile, whose compiled backward no module hook sees; the stack's compiled recompute is "
                "suites/patterns' to judge)"
                if seen.compiled
                else ""
            )
            if not seen.recomputed and seen.raised is None:
                self._record(
                    f"{setup.name}.{recipe.name}.recomputed_modules",
                    0,
                    unit="modules",
                    device=self._device,
                    dtype=str(recipe.dtype),
                    note="no module's forward ran again in the backward: no activation checkpointing to check" + eager,
                )
                continue
            wrong = seen.mismatches()
            problems = list(wrong)
            blocked = blocked or seen.raised is not None
            if seen.raised is not None:
                where = f" while recomputing {seen.raised_in[-1]!r}" if seen.raised_in else ""
                problems.append(f"the backward raised{where}: {seen.raised}")
            self._judged(
                Kind.RECOMPUTE,
                recipe.name,
                compare_claim(
                    f"{setup.name}.{recipe.name}.recompute_mismatches",
                    len(problems),
                    not problems,
                    "every module the backward recomputes (activation checkpointing) runs in the dtypes of its "
                    "forward under the same autocast" + eager,
                    detail=f"{len(seen.recomputed)} module(s) recomputed; "
                    + (
                        f"recomputed in another precision in {', '.join(RC.blocks_of(seen.mismatched_modules(), seen.recomputed))}: "
                        if wrong
                        else ""
                    )
                    + "; ".join(problems[:5]),
                    expected=0,
                    allowance=0,
                    unit="problems",
                ),
                device=self._device,
                dtype=str(recipe.dtype),
                tags={
                    "recomputed": seen.recomputed[:50],
                    "mismatched": wrong[:20],
                    "raised": seen.raised,
                    "raised_in": seen.raised_in,
                    "compiled": seen.compiled,
                },
            )
        return blocked

    def resume_verdicts(self, setup: Setup, recipes: Sequence[Recipe], at: int) -> None:
        """Each recipe saved before step ``at`` and resumed in fresh objects, against the uninterrupted run."""
        last = frozenset({setup.steps - 1})
        for recipe in recipes:
            whole = train(setup, recipe, device=self._device, keep_weights_at=last)
            resumed = train(setup, recipe, device=self._device, keep_weights_at=last, resume_at=at)
            diffs = resume_differences(whole, resumed)
            if recipe.scaler:
                moved = whole.scales[at] != whole.scales[0]
                self._record(
                    f"{setup.name}.{recipe.name}.resume_scale_moved",
                    moved,
                    device=self._device,
                    dtype=str(recipe.dtype),
                    tags={"resume_at": at, "scale_at_resume": whole.scales[at], "initial_scale": whole.scales[0]},
                    note="the scale had moved before the save: a scaler restored wrongly would show"
                    if moved
                    else f"the scale had not moved before step {at}: a scaler whose state is not restored cannot "
                    "show here (save later, or give the setup a scaler whose scale moves)",
                )
            self._judged(
                Kind.RESUME,
                recipe.name,
                compare_claim(
                    f"{setup.name}.{recipe.name}.resume_differences",
                    len(diffs),
                    not diffs,
                    f"saved before step {at} (model, optimizer, schedule, scaler, RNG and data generator states) and "
                    "loaded into fresh objects, the run continues bit for bit as the uninterrupted one: losses, "
                    "scales, skipped steps, final weights",
                    detail=f"resumed before step {at}, it parts from the uninterrupted run: "
                    + " | ".join(diffs[:4])
                    + (f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else ""),
                    expected=0,
                    allowance=0,
                    unit="differences",
                ),
                device=self._device,
                dtype=str(recipe.dtype),
                tags={"resume_at": at},
            )

    def overflow_verdicts(self, setup: Setup, recipes: Sequence[Recipe]) -> list[str]:
        """Overflow handling of each recipe with a loss scaler (controls excepted): a verdict row
        per planted step; returns the failure messages."""
        failures: list[str] = []
        for recipe in recipes:
            if not recipe.scaler or recipe.control:
                continue
            for step in O.run(setup, recipe, self._device):
                p = step.planted
                tags = {
                    "step": p.step,
                    "parameter": p.parameter,
                    "element": p.element,
                    "planted": step.label,
                    "scale_before": step.scale_before,
                    "scale_after": step.scale_after,
                    "changed": list(step.changed),
                }
                verdict = O.judge(setup.name, recipe, step)
                if not self._judged(
                    Kind.OVERFLOW, recipe.name, verdict, device=self._device, dtype=str(recipe.dtype), tags=tags
                ):
                    failures.append(explain(verdict))
        return failures

    def require_parity(
        self, setup: Setup, result: RecipeResult, band: Band, tags: dict[str, Any] | None = None
    ) -> None:
        """:meth:`parity_verdict`, failing the test on a miss (the training suite's assertion)."""
        __tracebackhide__ = True
        failure = self.parity_verdict(setup, result, band, tags)
        if failure is not None:
            raise AssertionError(failure)
