"""The pytest plugin's entry module (``pytest11`` entry point ``amp_harness``): hooks only.

Options live in :mod:`~harness.pytest_plugin.options`, the session in
:mod:`~harness.pytest_plugin.state`, fixtures in :mod:`~harness.pytest_plugin.fixtures` (their
own entry point), rows and verdicts in :mod:`~harness.pytest_plugin.recording`. torch is imported
lazily so that an installed harness costs nothing in unrelated pytest runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from harness.domains.capabilities import CAPABILITIES, capability_of_fixtures
from harness.domains.engines.ranks import world as W
from harness.numerics.verdict import Outcome
from harness.pytest_plugin import journaling
from harness.pytest_plugin import options as opts
from harness.pytest_plugin.examples import independent_of_loaded_modules
from harness.pytest_plugin.limits import TestHung
from harness.pytest_plugin.machine import MachineLock, is_timing, lock_directory
from harness.pytest_plugin.markers import DEVICE_TYPES, MARKERS, tier_of
from harness.pytest_plugin.ownership import apply_profile_to_given, hypothesis_profile_of_ours, is_ours
from harness.pytest_plugin.recording import CAPABILITY_PROPERTY, capability_of
from harness.pytest_plugin.state import STATE, WORKER_KEY, State, selected_devices, state_of, suite_of
from harness.pytest_plugin.summary import run_metadata, terminal_lines
from harness.storage import baselines as bl
from harness.storage import report as rp


def pytest_addoption(parser: pytest.Parser) -> None:
    opts.add_options(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    options = opts.parse(config)
    opts.check_cuda_request(options.devices)
    if opts.hypothesis_is_needed(config):  # otherwise when an amp-harness test runs: inert elsewhere
        opts.register_hypothesis_profiles()
    workerinput = getattr(config, "workerinput", None)
    run_id = workerinput.get("amp_run_id") if workerinput else None
    config.stash[STATE] = State(
        options=options,
        rootdir=Path(config.rootpath),
        run_id=run_id or rp.new_run_id(),
        started=rp.now_iso(),
        store=bl.BaselineStore(options.baseline_dir, candidates=options.candidates_dir),
        is_worker=workerinput is not None,
        worker_id=workerinput.get("workerid") if workerinput else None,
        worker_count=int(workerinput.get("workercount", 0)) if workerinput else 0,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Under several xdist workers, in a run with timing tests, each test holds the machine lock:
    shared, and a timing test alone, kept for a timing test next (:mod:`harness.pytest_plugin.machine`)."""
    machine = state_of(item.config).machine
    if machine is None:
        return (yield from _under_profile(item))
    with machine.held(alone=is_timing(item), keep=nextitem is not None and is_timing(nextitem)):
        return (yield from _under_profile(item))


def _under_profile(item: pytest.Item) -> Generator[None, object, object]:
    """Only amp-harness tests run under its hypothesis profile; the one active before comes back.
    Under a derandomized one, hypothesis's examples do not depend on the modules loaded so far
    (:mod:`harness.pytest_plugin.examples`)."""
    ours = is_ours(item)
    if ours:
        state_of(item.config).share_cores()
    profile = hypothesis_profile_of_ours(item.config) if ours else None
    if profile is None:
        return (yield)
    from hypothesis import settings

    opts.register_hypothesis_profiles()
    previous = settings.get_current_profile_name()
    settings.load_profile(profile)
    # reproducible rows under a derandomized profile: the same examples whatever ran before
    guard = independent_of_loaded_modules() if settings().derandomize else contextlib.nullcontext()
    try:
        with guard:
            return (yield)
    finally:
        settings.load_profile(previous)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: give every worker the same run id."""
    node.workerinput["amp_run_id"] = state_of(node.config).run_id


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    st = state_of(metafunc.config)
    if "amp_device" in metafunc.fixturenames:
        devices = selected_devices(st.options.devices, st.worker_id)
        # ids without the index: every xdist worker must collect the same test ids
        metafunc.parametrize("amp_device", devices, indirect=True, ids=[d.split(":")[0] for d in devices])
    if "amp_dtype" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("amp_thorough_dtypes")
        heavy = set(marker.args) if marker is not None else set()
        unknown = heavy - set(opts.DTYPE_NAMES)
        if unknown:
            raise pytest.UsageError(
                f"{metafunc.definition.nodeid}: amp_thorough_dtypes({', '.join(sorted(unknown))}): "
                f"not a dtype; choose from {', '.join(opts.DTYPE_NAMES)}"
            )
        on = marker.kwargs.get("on") if marker is not None else None
        if on is not None and on not in DEVICE_TYPES:
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: amp_thorough_dtypes(on={on!r}): choose cpu or cuda")
        everywhere = heavy if on is None else set()  # on one device type: decided per item, at collection
        metafunc.parametrize(
            "amp_dtype",
            [pytest.param(d, marks=pytest.mark.amp_thorough) if d in everywhere else d for d in st.options.dtypes],
            indirect=True,
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    st = state_of(config)
    rank = opts.TIERS.index(st.options.tier)
    cuda_reason: str | None = None
    profile = hypothesis_profile_of_ours(config)
    own_tests = opts.self_test_prefixes(config)
    for item in items:
        if not is_ours(item):
            continue
        if profile is not None:
            apply_profile_to_given(item, profile)
        marker = item.get_closest_marker("amp_capability")
        if rp.origin_of(item.nodeid, own_tests) == rp.SELF_TEST:
            pass  # the project's test of itself decides no capability of the stack
        elif marker is not None:
            capability = str(marker.args[0]) if marker.args else ""
            if capability not in CAPABILITIES:
                raise pytest.UsageError(
                    f"{item.nodeid}: amp_capability({capability!r}) is not a capability of the qualification "
                    f"verdict; choose one of {', '.join(CAPABILITIES)} (harness/domains/capabilities.py)"
                )
            item.user_properties.append((CAPABILITY_PROPERTY, capability))
        else:
            inferred = capability_of_fixtures(getattr(item, "fixturenames", ()))
            if inferred is not None:
                item.user_properties.append((CAPABILITY_PROPERTY, inferred))
        tier, emulated = tier_of(item)
        if opts.TIERS.index(tier) > rank:
            why = f" where {emulated}" if emulated is not None else ""
            item.add_marker(pytest.mark.skip(reason=f"{tier} tier{why}: run with --amp-tier={tier}"))
        if item.get_closest_marker("amp_cuda"):
            if cuda_reason is None:
                import torch

                cuda_reason = "" if torch.cuda.is_available() else opts.cuda_missing_reason()
            if cuda_reason:
                item.add_marker(pytest.mark.skip(reason=cuda_reason))
    if st.worker_count > 1 and st.machine is None and any(is_timing(i) for i in items):
        st.machine = MachineLock(lock_directory(config))


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        state_of(items[0].config).deselected += len(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Count test outcomes for the run metadata, and keep each test's result for the report."""
    rep = yield
    st = state_of(item.config)
    xfail = hasattr(rep, "wasxfail")
    outcome: str = ("xfailed" if rep.skipped else "xpassed") if xfail and not rep.failed else rep.outcome
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        st.count_test("xfailed" if outcome == "xfailed" else rep.outcome)
    hung = call.excinfo is not None and call.excinfo.errisinstance(TestHung)
    message, detail = _first_line(rep, call), ""
    if hung:  # pytest counts it failed; its result says why
        assert call.excinfo is not None
        outcome, message = Outcome.HUNG.value, str(call.excinfo.value)
        detail = str(getattr(call.excinfo.value, "stacks", ""))
    capability = capability_of(item.user_properties)
    st.record_test(item.nodeid, suite_of(item), rep.when, outcome, rep.duration, message, detail, capability)
    return rep


def _first_line(rep: pytest.TestReport, call: pytest.CallInfo[None]) -> str:
    """What a reader sees first: the exception's first line, or the skip reason."""
    if rep.passed:
        return ""
    if rep.skipped:
        longrepr = rep.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(getattr(rep, "wasxfail", ""))
    elif call.excinfo is not None:
        text = call.excinfo.exconly()
    else:
        text = rep.longreprtext
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):  # "training checks of 'x' failed:" says what follows
        lines = [f"{lines[0]} {lines[1]}"]
    return lines[0][:300] if lines else ""


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Baselines are renamed into place and the run report is written; neither can lose the
    other, and neither raises: what could not be written is reported and fails the session."""
    st = state_of(session.config)
    if st.machine is not None:
        st.machine.close()
        st.machine = None
    launched = W.launched() if st.activated and not st.is_worker else None
    if launched is not None and launched.rank != 0:
        st.store.abandon()  # rank 0 alone writes baselines and the run report
    else:
        st.written = [str(p) for p in st.store.flush()]
        st.write_errors += [(str(p), why) for p, why in st.store.errors]
    if launched is not None and not _gathered_to_rank_0(st, launched):
        journaling.close(st)
        journaling.finished(st, report_written=True)  # rank 0 holds this rank's records now
        return
    if st.is_worker:
        journaling.close(st)  # its records travel to the controller now: the journal says it ended
        session.config.workeroutput[WORKER_KEY] = st.worker_output()  # type: ignore[attr-defined]
        return
    journaling.take_in_dead_workers(st)
    journaling.close(st)
    if st.broken and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if st.report_path is None and st.options.report_dir is not None and (st.activated or st.rows or st.broken):
        try:
            st.report_path = rp.write(
                st.options.report_dir, st.run_id, st.rows, run_metadata(session, st), st.attachments
            )
        except OSError as exc:
            st.write_errors.append((str(st.options.report_dir / st.run_id), f"run report: {bl.describe_os_error(exc)}"))
    journaling.finished(st, report_written=st.report_path is not None)
    if st.write_errors and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _gathered_to_rank_0(st: Any, launched: W.LaunchedWorld) -> bool:
    """Under a launcher: every rank's rows, tagged with its rank, local rank and host, gathered to
    rank 0 (which merges them as xdist's controller merges its workers'). True on rank 0."""
    import torch.distributed as dist

    W.join(launched)
    for row in st.rows:
        row["tags"] = json.dumps({**json.loads(row.get("tags") or "{}"), **launched.tags}, sort_keys=True)
    out = st.worker_output()
    gathered: list[Any] | None = [None] * launched.world_size if launched.rank == 0 else None
    dist.gather_object(out, gathered, dst=0)
    if gathered is None:
        return False
    for other in gathered[1:]:
        st.merge_worker(other)
    return True


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: merge a worker's rows, writes and used baselines."""
    out = getattr(node, "workeroutput", {}).get(WORKER_KEY)
    if out:
        state_of(node.config).merge_worker(out)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    st = state_of(config)
    launched = W.launched() if st.activated else None
    if st.is_worker or (launched is not None and launched.rank != 0):
        return
    lines = terminal_lines(st)
    if lines:
        terminalreporter.write_sep("-", "amp-harness")
        for line in lines:
            terminalreporter.write_line(line)
