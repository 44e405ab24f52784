"""The plugin's hooks that make a crash or a hang a result (``pytest11`` entry point
``amp_harness_resilience``): the journal opened and fed, each amp-harness test under its time
limit, ``--amp-isolate``, and the xdist controller's record of a worker that died.

Hooks only; the journal's lifecycle is :mod:`~harness.pytest_plugin.journaling`, the limits
:mod:`~harness.pytest_plugin.limits`. Inert in a project that runs no amp-harness test: nothing is
journaled and no limit is armed before one starts.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from harness.numerics.verdict import Outcome
from harness.pytest_plugin import crashes, journaling, limits
from harness.pytest_plugin.ownership import is_ours
from harness.pytest_plugin.recording import capability_of
from harness.pytest_plugin.state import STATE, state_of, suite_of
from harness.storage import journal as jr

#: ``--amp-isolate``: the crashed workers xdist replaces before it gives up on the run. Each
#: replacement follows a test that crashed its worker (xdist hands the rest to the new one), so a
#: run stops early only on a stack where this many tests crash: it has answered the question by
#: then, and a worker that crashes while collecting would otherwise be replaced forever.
ISOLATE_MAX_CRASHES = 20


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """``--amp-isolate``: one xdist worker (unless ``-n`` says more), replaced after a crash."""
    if not config.getoption("--amp-isolate", default=False) or hasattr(config, "workerinput"):
        return  # a worker runs its tests itself
    if not config.pluginmanager.hasplugin("xdist") or not hasattr(config.option, "numprocesses"):
        raise pytest.UsageError(
            "--amp-isolate runs the tests in a pytest-xdist worker that is replaced when a test crashes it: "
            "install pytest-xdist (pip install pytest-xdist), and do not disable it with -p no:xdist"
        )
    if config.getoption("usepdb", default=False):
        raise pytest.UsageError("--amp-isolate runs the tests in a worker process: --pdb cannot reach it; drop one")
    if not config.option.numprocesses:
        config.option.numprocesses = 1
    if config.option.maxworkerrestart is None:
        config.option.maxworkerrestart = str(ISOLATE_MAX_CRASHES)


def pytest_configure(config: pytest.Config) -> None:
    """Keep the terminal's stderr for the fault handler; make the reports of dead sessions'
    journals in this report directory (and in the one ``--amp-resume`` names)."""
    if STATE not in config.stash:
        return
    crashes.remember_terminal()
    st = state_of(config)
    st.recovered_runs = journaling.recover_stale(st)
    if st.options.resume_dir is not None and st.options.resume_dir != st.options.report_dir and not st.is_worker:
        st.recovered_runs += journaling.recover_stale(st, st.options.resume_dir)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--amp-resume=DIR``: the tests that have a result in DIR's run reports are deselected."""
    if STATE not in config.stash:
        return
    st = state_of(config)
    if st.options.resume_dir is None:
        return
    done = jr.finished_tests(st.options.resume_dir)
    finished = [item for item in items if item.nodeid in done]
    if finished:
        config.hook.pytest_deselected(items=finished)
        items[:] = [item for item in items if item.nodeid not in done]
    st.resumed = {"from": str(st.options.resume_dir), "finished_before": len(finished), "left": len(items)}


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """The test's start journaled (an amp-harness test opens the journal), then the test under its
    time limit (amp-harness tests only; the innermost wrapper: the harness's own set-up around a
    test is not timed), then its result journaled. A limit that strikes between the test's phases,
    where pytest does not catch it, is the test's HUNG result too, never the session's end."""
    if STATE not in item.config.stash:  # the harness's main plugin is disabled (-p no:amp_harness)
        return (yield)
    st = state_of(item.config)
    ours = is_ours(item)
    capability = capability_of(item.user_properties)
    journaling.test_starts(item, st, ours, capability)
    seconds = _limit_of(item, st.options.timeout_s, st.options.heavy_timeout_s) if ours else 0.0
    option = "--amp-timeout-heavy" if suite_of(item) in limits.HEAVY_SUITES else "--amp-timeout"
    last_resort = not float(item.config.getini("faulthandler_timeout") or 0)
    try:
        with limits.time_limit(seconds, item.nodeid, option, last_resort=last_resort):
            return (yield)
    except limits.TestHung as hung:
        st.count_test("failed")
        st.record_test(
            item.nodeid, suite_of(item), "call", Outcome.HUNG.value, seconds, str(hung), hung.stacks, capability
        )
        return True
    finally:
        st.test_ended(item.nodeid)


def _limit_of(item: pytest.Item, default_s: float, heavy_s: float) -> float:
    """The test's limit: its ``amp_timeout(seconds)`` marker, else its suite's option."""
    marker = item.get_closest_marker("amp_timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return heavy_s if suite_of(item) in limits.HEAVY_SUITES else default_s


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: a worker went down; keep its exit status if it crashed."""
    if STATE in node.config.stash:
        journaling.node_down(state_of(node.config), node, error)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: Any) -> None:
    """xdist controller: a worker died running ``crashitem``: a CRASHED (or HUNG) result, and the
    report's text says which signal and where the journal is."""
    worker = getattr(report, "node", None)
    worker_id = str(getattr(getattr(worker, "gateway", None), "id", "") or "")
    config = getattr(worker, "config", None) or _config_of(sched)
    if config is None or STATE not in config.stash:
        return
    st = state_of(config)
    journaling.worker_crashed(config, st, crashitem, worker_id)
    result = st.broken.get(crashitem)
    if result is not None:
        report.longrepr = f"{report.longrepr}\n{result['message']}"


def _config_of(sched: Any) -> pytest.Config | None:
    config = getattr(sched, "config", None)
    return config if isinstance(config, pytest.Config) else None


def pytest_unconfigure(config: pytest.Config) -> None:
    """The fault handler goes back, whatever ended the session (a usage error, an interrupt)."""
    if STATE in config.stash:
        journaling.close(state_of(config))
