"""What a test gets from the ``amp_baseline`` fixture: golden baselines with their lifecycle. It
receives only what it needs (the store, the mode, a provenance callback, a recorder), not the
session. (The bring-your-own-model training checks live in the training domain,
:mod:`harness.domains.training.check`; the ``amp_training`` fixture only builds them.)"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
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
    from harness.domains.repro import FailureRepro


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

    def has(self, name: str, *, key: bl.KeyKind = bl.KeyKind.STACK, device: str | None = None) -> bool:
        """Whether :meth:`check` of ``name`` would judge this run: this key holds the baseline, or
        the run records it (``--amp-regen`` / ``--amp-accept-all``). A claim that only a baseline
        of its own key can judge (bitwise known answers) is NOT JUDGED without one, never held to
        another key's and never created silently.

        Example::

            if not amp_baseline.has("answers_of_this_card"):
                pytest.skip("NOT JUDGED: record them with --amp-regen")
        """
        dev = device or self._ctx.primary_device
        path = self._ctx.store.path_for(self._record.suite, self._ctx.key_for(key, dev), name)
        return self._ctx.mode is not bl.Mode.CHECK or path.exists()

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
