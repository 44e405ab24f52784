"""The objects suites get from fixtures besides the recorder: golden baselines and the
bring-your-own-model training checks. Each receives only what it needs (the store, the mode, a
provenance callback, a recorder), not the session."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness.numerics.comparison import DataComparison
from harness.numerics.tolerance import EXACT, Tolerance
from harness.numerics.verdict import Outcome
from harness.pytest_plugin.recording import Recorder
from harness.storage import baselines as bl

if TYPE_CHECKING:
    import torch

    from harness.domains.repro import FailureRepro
    from harness.domains.training import Band, ParityReport, Recipe, RecipeResult, Setup
    from harness.domains.training.diagnosis import Diagnosis
    from harness.domains.training.ops import OpPrint
    from harness.domains.training.result import Checked, Kind, TrainingResult
    from harness.numerics.comparison import AnyComparison


def display(path: Path) -> str:
    """A path as messages show it: relative to the working directory where possible."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


@dataclass(frozen=True)
class BaselineContext:
    """What the baseline lifecycle needs from the session, and nothing else."""

    store: bl.BaselineStore
    mode: bl.Mode
    #: (device) -> (baseline key for a key kind, provenance block)
    key_for: Callable[[bl.KeyKind, str], str]
    provenance_for: Callable[[str], dict[str, Any]]
    primary_device: str
    #: extra options the regenerate command must repeat (--amp-profile, --amp-baseline-dir)
    regen_options: tuple[str, ...]


class Baselines:
    """Golden baselines with the pytest-regressions lifecycle.

    Example::

        def test_fp8_casts(amp_baseline):
            amp_baseline.check("fp8_casts_cpu", observed_table, key=KeyKind.STACK)

    A missing baseline fails and is written; a mismatch fails with a per-value diff, leaves
    ``<name>.obtained.json`` and names the exact command that regenerates it.
    """

    def __init__(self, ctx: BaselineContext, nodeid: str, recorder: Recorder) -> None:
        self._ctx, self._nodeid, self._record = ctx, nodeid, recorder

    def regen_command(self) -> str:
        return " ".join(["pytest", shlex.quote(self._nodeid), "--amp-regen", *self._ctx.regen_options])

    def reference(
        self, name: str, *, key: bl.KeyKind = bl.KeyKind.PROFILE, device: str | None = None
    ) -> tuple[str, Any] | None:
        """When this key has no baseline ``name`` of its own and the run only checks (no
        ``--amp-regen`` / ``--amp-accept-all``): (display path, stored data) of the same baseline
        under another key, to compare against within a cross-class allowance. None otherwise: the
        lifecycle of :meth:`check` applies (a key with its own baseline is held to it).

        Example::

            ref = amp_baseline.reference("loss_curves_mlp")
            if ref is not None:
                path, data = ref   # compare, and say which reference was used
        """
        dev = device or self._ctx.primary_device
        own_key = self._ctx.key_for(key, dev)
        store = self._ctx.store
        if self._ctx.mode is not bl.Mode.CHECK or store.path_for(self._record.suite, own_key, name).exists():
            return None
        hint = f"Regenerate: {self.regen_command()}"
        for path in store.references(self._record.suite, name, own_key):
            try:
                doc = store.read(path, hint)
            except bl.BaselineError:
                continue
            if doc is not None:
                store.used.add(path)
                return display(path), doc.data
        return None

    def check(
        self,
        name: str,
        data: Any,
        *,
        key: bl.KeyKind = bl.KeyKind.STACK,
        tolerance: Tolerance = EXACT,
        device: str | None = None,
        comparator: Callable[[Any, Any], DataComparison] | None = None,
        tags: dict[str, Any] | None = None,
        repro: Callable[[DataComparison, Any], FailureRepro | None] | None = None,
    ) -> None:
        """``tags`` are added to the baseline row; the mapping is read after the comparison, so a
        comparator may fill it (the golden curves record which lane judged them). ``repro``, called
        only on a mismatch with the differences and the stored data, returns what shows them
        without the harness (``amp-harness repro``); the baseline file is added to its allowance."""
        __tracebackhide__ = True
        dev = device or self._ctx.primary_device
        result = bl.check(
            self._ctx.store,
            suite=self._record.suite,
            name=name,
            key=self._ctx.key_for(key, dev),
            key_kind=key,
            data=data,
            provenance=self._ctx.provenance_for(dev),
            mode=self._ctx.mode,
            regen_command=self.regen_command(),
            tolerance=tolerance,
            display=display,
            comparator=comparator,
        )
        diffs = 0 if result.comparison is None else len(result.comparison.differences)
        kept = None
        if repro is not None and result.comparison is not None and not result.passed:
            kept = repro(result.comparison, result.stored)
            if kept is not None:
                kept = replace(kept, allowance=f"{kept.allowance} (baseline {display(result.path)})")
        self._record(
            f"baseline.{name}",
            diffs,
            unit="values differing",
            expected=0,
            allowance=0,
            outcome=Outcome.of(result.passed),
            device=dev,
            tags={
                "baseline": display(result.path),
                "mode": self._ctx.mode.value,
                "status": result.status.value,
                **(tags or {}),
                **self._record.repro_tags(kept),
            },
            note=result.summary,
        )
        if not result.passed:
            pytest.fail(result.message, pytrace=False)


class TrainingChecks:
    """Bring your own model: parity, the AMP lane, determinism and gradient census of the training suite.

    Example::

        def test_my_model(amp_training):
            setup = harness.api.Setup("mine", model, batch, loss, steps=20, lr=1e-3)
            amp_training.check(setup, [harness.api.BF16, harness.api.FP16_SCALER])

    Every verdict comes from :mod:`harness.domains.training` (the same functions the training
    suite uses); this object only records them and fails the test with every miss. A failed
    parity verdict is diagnosed (:mod:`harness.domains.training.diagnosis`): the module where the
    AMP run departs from fp32 is named in the message and recorded.
    """

    def __init__(self, recorder: Recorder, device: torch.device) -> None:
        self._record, self._device = recorder, device
        #: while :meth:`check` runs: the verdicts, diagnoses and notes it collects
        self._collected: list[Checked] | None = None
        self._diagnoses: dict[str, Diagnosis] = {}
        self._notes: dict[tuple[Kind, str], str] = {}

    def _judged(self, kind: Kind, recipe: str, comparison: AnyComparison, **row: Any) -> bool:
        """Record one verdict as a row (and, inside :meth:`check`, keep it for the result)."""
        from harness.domains.training.result import Checked

        if self._collected is not None:
            self._collected.append(Checked(kind, recipe, comparison))
        return self._record.result(comparison, **row)

    @property
    def device(self) -> torch.device:
        """Where the checks train."""
        return self._device

    def on(self, device: str | torch.device) -> TrainingChecks:
        """The same checks on another device: ``amp_training.on("cuda:1").check(setup, [BF16])``."""
        import torch

        return TrainingChecks(self._record, torch.device(device))

    def parity_verdict(
        self, setup: Setup, result: RecipeResult, band: Band, tags: dict[str, Any] | None = None
    ) -> str | None:
        """Record one recipe's parity verdict (and, when it fails, its diagnosis); the failure
        message, or None when it passed."""
        from harness.domains import training as T
        from harness.domains.training import repro as training_repro
        from harness.domains.training.diagnosis import diagnose
        from harness.domains.training.result import Kind
        from harness.numerics.comparison import explain

        verdict = T.judge(setup.name, result)
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
        clipping = T.judge_clipping(setup.name, result)
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
        from harness.domains.training import amp_lane as L
        from harness.domains.training import repro as training_repro
        from harness.domains.training.result import Kind
        from harness.numerics.comparison import explain

        failures: list[str] = []
        references: dict[torch.dtype, L.LaneReference] = {}
        for r in report.results:
            dtype = L.lane_dtype(r.recipe)
            if dtype is None or not r.run.states:
                continue
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
        from harness.domains.training.diagnosis import localise
        from harness.domains.training.ops import first_over_budget, localised

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
        from harness.domains.training.ops import repro_of

        repro = repro_of(o, self._device)
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
        from harness.domains.training import amp_lane as L

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
    ) -> TrainingResult:
        """Parity, the AMP lane with its positive controls, determinism, the gradient census and,
        for recipes with a loss scaler, overflow handling of ``recipes`` on ``setup``; returns a
        :class:`~harness.domains.training.result.TrainingResult` with every verdict, and fails the
        test with every miss by raising
        :class:`~harness.domains.training.result.TrainingCheckFailed` (an ``AssertionError``
        carrying the same result). Overflow handling (``overflow=False``: not tried) runs the recipe
        once more with a non-finite gradient element planted at checkpoint steps: your optimizer and
        scaler must leave parameters and optimizer state untouched there and back the scale off
        (:mod:`harness.domains.training.overflow`). A recipe that passes on a setup
        where the lane does not see the canonical broken recipes (no fp32 master weights; for fp16,
        no loss scaling) is INCONCLUSIVE, naming them (``power=False``: not tried, for a setup whose
        power is shown otherwise).
        ``ladder=True`` also measures the smallest gradient noise the lane catches on this setup
        (a lane per noise level: about the cost of the lane again per level). A call that
        could only be vacuous (no recipes, a non-recipe, fewer than 2 seeds, too few checkpoints)
        is refused before anything trains."""
        __tracebackhide__ = True
        from harness.domains import training as T
        from harness.domains.training.result import Kind, TrainingCheckFailed, TrainingResult

        n = T.DEFAULT_SEEDS if seeds is None else seeds
        recipes = T.validate(setup, recipes, n)
        collected: list[Checked] = []
        self._collected, self._diagnoses, self._notes = collected, {}, {}
        try:
            counted: dict[str, float] | None = None
            underflow: float | None = None
            if census:
                c = T.gradient_census(T.fp32_gradients(setup, device=self._device))
                underflow = float(c["underflow_share"])
                counted = {"underflow_share": underflow, "subnormal_share": float(c["subnormal_share"])}
                self._record(
                    f"{setup.name}.grad.underflow_share", c["underflow_share"], unit="share", device=self._device
                )
                self._record(
                    f"{setup.name}.grad.subnormal_share", c["subnormal_share"], unit="share", device=self._device
                )
            report = T.check_parity(setup, recipes, seeds=n, device=self._device)
            result = TrainingResult(setup.name, report, collected, counted, self._diagnoses, notes=self._notes)
            for r in report.results:
                self.parity_verdict(setup, r, report.band)
            if lane:
                self.lane_verdicts(setup, report, underflow, power)
                if ladder:
                    for recipe in recipes:
                        result.detection_limits[recipe.name] = self.detection_ladder(setup, recipe, report)
            if overflow:
                self.overflow_verdicts(setup, recipes)
            if determinism:
                for recipe in recipes:
                    same, first = T.is_deterministic(setup, recipe, self._device)
                    self._judged(
                        Kind.DETERMINISM,
                        recipe.name,
                        T.judge_determinism(setup.name, recipe, same, first),
                        device=self._device,
                    )
        finally:
            self._collected = None
        if result.failures:
            raise TrainingCheckFailed(result)
        return result

    def overflow_verdicts(self, setup: Setup, recipes: Sequence[Recipe]) -> list[str]:
        """Overflow handling of each recipe with a loss scaler (controls excepted): a verdict row
        per planted step; returns the failure messages."""
        from harness.domains.training import overflow as O
        from harness.domains.training.result import Kind
        from harness.numerics.comparison import explain

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
