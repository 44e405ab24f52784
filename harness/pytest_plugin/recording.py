"""Where a verdict becomes both the report row and the assertion, so the two cannot disagree.

A :class:`Recorder` belongs to one test. It receives narrow collaborators (a row sink, the
profile of a device, a way to label the test for the qualification verdict), never the session.
``require(comparison)`` records the comparison's row with the comparison's own outcome and, if
it did not pass, fails the test with :func:`~harness.numerics.comparison.explain` of it; the
traceback is hidden so that a failure points at the suite's line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.domains.versions import KnownIssue, registry_verdict
from harness.numerics.comparison import (
    AnyComparison,
    compare_claim,
    explain,
)
from harness.numerics.verdict import Outcome
from harness.storage import report as rp

if TYPE_CHECKING:  # the plugin imports no torch until a test uses it
    from typing_extensions import Unpack

    from harness.domains.repro import FailureRepro

#: The JUnit XML properties the qualification verdict reads (``amp-harness qualify``).
CAPABILITY_PROPERTY = "amp_capability"
OUTCOME_PROPERTY = "amp_outcome"
NOTE_PROPERTY = "amp_note"


def capability_of(user_properties: Iterable[tuple[str, object]]) -> str | None:
    """The capability a test decides, from its item's (or report's) user properties; None: none."""
    return next((str(v) for k, v in user_properties if k == CAPABILITY_PROPERTY), None)


#: Row outcomes that label the whole test for the qualification verdict (once per test each):
#: every outcome more severe than a pass, so that qualify's Outcome.of_test sees what the run
#: report's readers see.
_LABELS = tuple(o for o in Outcome if o.severity > Outcome.PASS.severity)


@dataclass(frozen=True)
class TestIdentity:
    """Who records: the test's node id, suite and check name."""

    nodeid: str
    suite: str
    check: str


class Recorder:
    """Records measurements of one test as report rows; ``require`` also fails the test.

    Example::

        def test_fp16_max(amp_record):
            amp_record("fp16.max", 65504.0, unit="", note="largest finite fp16")   # information
            amp_record.require(compare_scalar("fp16.max", got, 65504.0, EXACT))     # row + verdict
    """

    def __init__(
        self,
        who: TestIdentity,
        run_id: str,
        sink: Callable[[rp.Row], None],
        profile_for: Callable[[str], str],
        label: Callable[[str, str], None],
        attach: Callable[[str, bytes], str] | None = None,
    ) -> None:
        self._who, self._run_id, self._sink, self._profile_for, self._label = who, run_id, sink, profile_for, label
        self._attach = attach
        self._labelled: set[Outcome] = set()

    @property
    def suite(self) -> str:
        return self._who.suite

    @property
    def check(self) -> str:
        return self._who.check

    def __call__(self, metric: str, value: float | int | bool | None, **fields: Unpack[rp.RowFields]) -> None:
        """Record one row; ``fields`` are the row's keywords (:class:`~harness.storage.report.RowFields`).
        Judged rows (pass/fail) should come from :meth:`require`, which decides the outcome and the
        assertion from the same comparison. ``comparable``/``drift``: see
        :func:`harness.storage.report.make_row` (judged rows are comparable and deterministic unless
        told otherwise; a statistic states its run-to-run ``drift``)."""
        outcome = Outcome.parse(fields.get("outcome", Outcome.INFO))
        dev = str(fields.get("device", ""))
        fields["check"] = fields.get("check") or self._who.check
        self._sink(
            rp.make_row(
                run_id=self._run_id,
                nodeid=self._who.nodeid,
                suite=self._who.suite,
                metric=metric,
                value=value,
                profile=self._profile_for(dev or "cpu"),
                **fields,
            )
        )
        if outcome in _LABELS and outcome not in self._labelled:
            self._labelled.add(outcome)
            self._label(outcome.value, fields.get("note", ""))

    def repro_tags(self, repro: FailureRepro | None) -> dict[str, Any]:
        """The tags that keep a failed check's reproduction: its spec, and its tensors saved
        beside the run report (``amp-harness repro`` writes the script from them)."""
        if repro is None:
            return {}
        name = None
        if repro.tensors:
            if self._attach is None:
                return {}
            name = self._attach(f"{self._who.check}.pt", repro.tensor_bytes())
        return {"repro": repro.spec(name)}

    def result(self, result: AnyComparison, *, repro: FailureRepro | None = None, **kw: Any) -> bool:
        """Record a comparison result as a row with its own outcome; returns whether it passed.
        The row's fields are the comparison's own :meth:`measurement`; ``note`` and ``tags``
        given here override and extend it. ``repro``: what reproduces the check without the
        harness, kept only when it failed (``amp-harness repro``)."""
        m = result.measurement()
        if not result.passed:
            kw["tags"] = {**(kw.get("tags") or {}), **self.repro_tags(repro)}
        self(
            m.metric,
            m.value,
            expected=m.expected,
            allowance=m.allowance,
            unit=m.unit,
            outcome=result.outcome,
            note=kw.pop("note", m.note),
            tags={**m.tags, **(kw.pop("tags", None) or {})},
            kind=kw.pop("kind", m.kind),
            **kw,
        )
        return result.passed

    def require(self, result: AnyComparison, *, repro: FailureRepro | None = None, **kw: Any) -> None:
        """Record ``result`` and fail the test with its explanation if it did not pass; ``repro``
        (kept on failure) lets ``amp-harness repro`` write a script that shows it without the harness."""
        __tracebackhide__ = True
        if not self.result(result, repro=repro, **kw):
            raise AssertionError(explain(result))

    def require_all(
        self,
        results: Iterable[AnyComparison],
        *,
        repro_of: Callable[[AnyComparison], FailureRepro | None] | None = None,
        **kw: Any,
    ) -> None:
        """Record every result, then fail the test with the explanation of each that did not pass
        (all rows are written first: one failing element does not hide the others). ``repro_of``
        gives each failed result its own reproduction (called only for those)."""
        __tracebackhide__ = True
        missed = [
            r for r in results if not self.result(r, repro=None if repro_of is None or r.passed else repro_of(r), **kw)
        ]
        if missed:
            raise AssertionError("\n".join(explain(r) for r in missed))

    def require_unless_known(
        self, result: AnyComparison, issue: KnownIssue, *, device: Any, its_shape: bool = True, **kw: Any
    ) -> None:
        """Require ``result``, unless it failed on a stack the registry lists ``issue`` for: then a
        KNOWN row and a skip naming the issue (its registry check observes it on every run, so a
        release that fixes it is noticed). ``its_shape=False``: this failure is not the issue's (a
        check that raised, say), and is judged as any failure.

        Example::

            amp_record.require_unless_known(claim, KNOWN_ISSUES[ISSUE_ID], device=amp_device, dtype=amp_dtype)
        """
        __tracebackhide__ = True
        import pytest
        import torch

        if not result.passed and its_shape and issue.listed(torch.__version__, str(getattr(device, "type", device))):
            where = {k: kw[k] for k in ("dtype",) if k in kw}
            detail = getattr(result, "detail", ()) or (result.explain().splitlines() or [""])
            self(result.name, True, outcome=Outcome.KNOWN, device=device, note=detail[0], **where)
            pytest.skip(f"KNOWN on torch {torch.__version__}: {issue.id} ({issue.reference})")
        self.require(result, device=device, **kw)

    def require_registry(
        self,
        issue: KnownIssue,
        present: bool,
        where: str,
        *,
        seen: object = None,
        version: str | None = None,
        device: Any = None,
        hardware_class: str | None = None,
        listed: bool | None = None,
        context: str | None = None,
        tags: Mapping[str, object] | None = None,
        **kw: Any,
    ) -> None:
        """A registry check, written once: ``issue`` observed (``present``) on this stack, judged by
        :func:`~harness.domains.versions.registry_verdict` against its lifecycle, recorded and required.
        ``version`` defaults to torch's (a torchao issue passes torchao's); ``device`` (a torch device)
        picks the device's lifecycle and is named in the verdict; ``listed`` overrides whether the
        registry lists this stack (a scaler issue also depends on the scaler class).

        Example::

            present = observe(issue_id)
            amp_record.require_registry(KNOWN_ISSUES[issue_id], present, f"{WHERE} ({issue_id!r})",
                                        seen=what_was_seen, device=amp_device)
        """
        __tracebackhide__ = True
        if version is None:
            import torch

            version = torch.__version__
        device_type = None if device is None else str(getattr(device, "type", device))
        if listed is None:
            listed = issue.listed(version, device_type or "cpu", hardware_class)
        if context is None:
            context = "" if device_type is None else f" on {device_type}"
            context += f" ({hardware_class})" if hardware_class else ""
        verdict = registry_verdict(
            issue, present, listed, version, where, context, device_type=device_type, hardware_class=hardware_class
        )
        observed: dict[str, object] = {issue.package: version, "listed_as_affected": listed}
        if seen is not None:
            observed["seen"] = seen
        if hardware_class is not None:
            observed["hardware_class"] = hardware_class
        if device is not None:
            kw.setdefault("device", device)
        self.require(verdict.claim, tags=verdict.tags(**observed, **(tags or {})), note=issue.summary, **kw)

    def require_repeatable(self, metric: str, unstable: Sequence[str], **kw: Any) -> None:
        """A bitwise check's precondition: its reference, run twice, gave the same bits. Where it did
        not (the device's kernels are not deterministic for it), a NOISY row names what moved, and the
        test skips: bit for bit is then no verdict either way.

        Example::

            reference, unstable = patterns.repeated(lambda: run(None), differing)
            amp_record.require_repeatable("checkpoint.reference_unstable", unstable, device=device)
        """
        __tracebackhide__ = True
        if not unstable:
            return
        import pytest

        note = (
            f"the reference, run twice on this device, differed ({', '.join(unstable[:6])}): its kernels are not "
            "deterministic here, so bit for bit is no verdict"
        )
        self(metric, len(unstable), unit="differences", outcome=Outcome.NOISY, note=note, **kw)
        pytest.skip(f"NOISY: {note}")

    def require_run(
        self,
        metric: str,
        criterion: str,
        run: Callable[[], object],
        *,
        repro: Callable[[BaseException], FailureRepro | None] | None = None,
        no_script: str | None = None,
        **kw: Any,
    ) -> None:
        """Run ``run`` (a hypothesis state machine, a model-based test) as one claim: PASS when it
        returns, FAIL when it raises, the row carrying the error's first lines (what diverged,
        where). The test fails with the same explanation, chained to the error. ``repro``, called
        with the error, returns what reproduces it without the harness; ``no_script`` says why a
        failure keeps none (``amp-harness repro`` prints it). ``tags`` are read after the run.

        Example::

            amp_record.require_run("conformance.megatron", "matches its specification",
                                   lambda: run_state_machine_as_test(machine))
        """
        __tracebackhide__ = True
        try:
            run()
        except Exception as exc:  # any divergence the run raises is the verdict
            lines = [line for line in f"{type(exc).__name__}: {exc}".splitlines() if line.strip()]
            claim = compare_claim(
                metric, 1, False, criterion, detail=lines[:12], expected=0, allowance=0, unit="errors"
            )
            tags = {**(kw.pop("tags", None) or {}), "failure": "\n".join(lines[:12])}
            if no_script is not None and repro is None:
                tags["no_script"] = no_script
            self.result(claim, tags=tags, repro=None if repro is None else repro(exc), **kw)
            raise AssertionError(explain(claim)) from exc
        self.result(compare_claim(metric, 0, True, criterion, expected=0, allowance=0, unit="errors"), **kw)

    def property_run(self, metric: str, criterion: str, **kw: Any) -> AbstractContextManager[Tally]:
        """Wrap a hypothesis run: one row with the examples seen and the worst value, pass or fail.

        Example::

            with amp_record.property_run("fp16.rel_error", "|cast(x) - x| <= u |x|") as tally:
                run_property(tally)          # tally.add(elements, worst, detail) per example
                tally.bound, tally.unit = u, "relative"
        """
        return _tallied(self, metric, criterion, kw)


@dataclass
class Tally:
    """What a property run saw: examples, elements, and the worst measured value against its bound."""

    examples: int = 0
    elements: int = 0
    worst: float | None = None
    bound: float | None = None
    unit: str = ""
    #: how the bound of the worst example was derived (recorded in the row's tags)
    detail: str = ""
    #: the failing example, reproducible without the harness (kept when the run fails)
    repro: FailureRepro | None = None

    def add(self, elements: int, worst: float | None = None, detail: str = "") -> None:
        self.examples += 1
        self.elements += elements
        if worst is not None and (self.worst is None or worst > self.worst):
            self.worst, self.detail = worst, detail or self.detail


def _derandomized() -> bool:
    """Whether the hypothesis profile in force draws the same examples every run."""
    from hypothesis import settings

    return bool(settings().derandomize)


@contextmanager
def _tallied(recorder: Recorder, metric: str, criterion: str, kw: dict[str, Any]) -> Iterator[Tally]:
    """The row of a property run: the worst value as a ratio to its bound (what can be trended
    across runs), comparable only under a derandomized hypothesis profile (the same examples every
    run); with random examples it is a maximum over a random sample, information."""
    tally = Tally()
    outcome = Outcome.FAIL
    failure: str | None = None
    try:
        yield tally
        outcome = Outcome.PASS
    except BaseException as exc:
        failure = "\n".join([line for line in str(exc).splitlines() if line.strip()][:12]) or type(exc).__name__
        raise
    finally:
        tags = {"examples": tally.examples, "elements": tally.elements, **kw.pop("tags", {})}
        if failure is not None:
            tags["failure"] = failure  # what the failing example showed, beside the worst value
            tags.update(recorder.repro_tags(tally.repro))
        if tally.detail:
            tags["derivation"] = tally.detail
        name, value, allowance, unit, comparable = metric, tally.worst, tally.bound, tally.unit, _derandomized()
        if tally.worst is not None and tally.bound:
            tags.update(worst=tally.worst, bound=tally.bound, bound_unit=tally.unit)
            name = metric if tally.bound == 1.0 else f"{metric}.worst_over_bound"
            value, allowance, unit = tally.worst / tally.bound, 1.0, "x bound"
        elif tally.worst is None:  # nothing measured but elements: a count, information
            value, allowance, unit, comparable = tally.elements, None, "elements checked", False
        recorder(
            name,
            value,
            allowance=allowance,
            unit=unit,
            outcome=outcome,
            tags=tags,
            note=criterion,
            comparable=comparable,
            **kw,
        )
