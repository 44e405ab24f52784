"""The objects suites get from fixtures besides the recorder: golden baselines and the
bring-your-own-model training checks. Each receives only what it needs (the store, the mode, a
provenance callback, a recorder), not the session."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    from harness.domains.training import ParityReport, Recipe, Setup


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
    ) -> None:
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
        self._record(
            f"baseline.{name}",
            diffs,
            unit="values differing",
            expected=0,
            allowance=0,
            outcome=Outcome.of(result.passed),
            device=dev,
            tags={"baseline": display(result.path), "mode": self._ctx.mode.value, "status": result.status.value},
            note=result.summary,
        )
        if not result.passed:
            pytest.fail(result.message, pytrace=False)


class TrainingChecks:
    """Bring your own model: parity, determinism and gradient census of the training suite.

    Example::

        def test_my_model(amp_training):
            setup = harness.domains.training.Setup("mine", model, batch, loss, steps=20, lr=1e-3)
            amp_training.check(setup, [training.BF16, training.FP16_SCALER])

    Every verdict comes from :mod:`harness.domains.training` (the same functions the training
    suite uses); this object only records them and fails the test with every miss.
    """

    def __init__(self, recorder: Recorder, device: torch.device) -> None:
        self._record, self._device = recorder, device

    def check(
        self, setup: Setup, recipes: Sequence[Recipe], seeds: int = 3, determinism: bool = True, census: bool = True
    ) -> ParityReport:
        __tracebackhide__ = True
        from harness.domains import training as T
        from harness.numerics.comparison import explain

        report = T.check_parity(setup, recipes, seeds=seeds, device=self._device)
        failures: list[str] = []
        for r in report.results:
            verdict = T.judge(setup.name, r)
            tags = {"control": r.recipe.control, "skipped_steps": r.run.skipped_at}
            if not self._record.result(verdict, device=self._device, tags=tags):
                failures.append(explain(verdict))
        if determinism:
            for recipe in recipes:
                same, first = T.is_deterministic(setup, recipe, self._device)
                verdict = T.judge_determinism(setup.name, recipe, same, first)
                if not self._record.result(verdict, device=self._device):
                    failures.append(explain(verdict))
        if census:
            c = T.gradient_census(T.fp32_gradients(setup, device=self._device))
            self._record(f"{setup.name}.grad.underflow_share", c["underflow_share"], unit="share", device=self._device)
            self._record(f"{setup.name}.grad.subnormal_share", c["subnormal_share"], unit="share", device=self._device)
        if failures:
            raise AssertionError(f"training checks of {setup.name!r} failed:\n" + "\n".join(failures))
        return report
