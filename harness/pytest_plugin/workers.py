"""What a serial run has that pytest-xdist's workers must not lose (``pytest11`` entry point
``amp_harness_workers``): hooks only.

The project runs ``pytest`` on two xdist workers by default. Two things a serial run had would be
gone without these hooks, and nothing would say so:

- **The launched world.** Under a launcher (torchrun, srun, a Kubernetes job), the run's processes
  are the world's ranks: each rank runs the tests itself and rank 0 gathers the report
  (:mod:`harness.domains.engines.ranks.world`). xdist workers inside a rank are not ranks, so xdist
  is turned off there, whatever ``-n`` the project's ``addopts`` say.
- **pytest-benchmark's results.** pytest-benchmark disables itself under xdist: a timing beside
  another worker's test is not a measurement. An amp-harness timing test holds the machine alone
  (:mod:`harness.pytest_plugin.machine`), so pytest-benchmark is kept on for it, its results
  travel to the controller, and ``--benchmark-json``, ``--benchmark-autosave`` and
  ``--benchmark-compare`` see the same cases as a serial run. Every other test keeps
  pytest-benchmark's own decision (inert in projects that run no amp-harness test).
"""

from __future__ import annotations

from collections.abc import Generator
from types import SimpleNamespace
from typing import Any

import pytest

from harness.domains.engines.ranks import world as W
from harness.pytest_plugin.machine import is_timing
from harness.pytest_plugin.ownership import is_ours

#: the workeroutput key a worker's pytest-benchmark results travel under
BENCHMARKS_KEY = "amp_harness_benchmarks"
_SHIPPED = pytest.StashKey[list[dict[str, Any]]]()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Under a launcher, xdist off: the world's ranks are the run's processes."""
    if hasattr(config, "workerinput") or not hasattr(config.option, "numprocesses"):
        return
    world = W.launched()
    if world is None:
        return
    if config.getoption("--amp-isolate", default=False):
        raise pytest.UsageError(
            f"--amp-isolate runs the tests in an xdist worker, but this is rank {world.rank} of a launched world of "
            f"{world.world_size}, whose ranks run the tests themselves: drop --amp-isolate under a launcher"
        )
    # every place xdist reads, whichever of xdist's and this hook ran first
    config.option.numprocesses = 0
    config.option.dist = "no"
    config.option.tx = []


def pytest_report_header(config: pytest.Config) -> str | None:
    world = W.launched()
    if world is None or not hasattr(config.option, "numprocesses"):
        return None
    return (
        f"amp-harness: rank {world.rank} of a launched world of {world.world_size}: xdist is off, "
        "this rank runs the tests itself and rank 0 writes the report"
    )


def _xdist_disabled_it(config: pytest.Config) -> Any | None:
    """pytest-benchmark's session in an xdist worker, where it disabled itself only because of xdist
    (not ``--benchmark-disable``, not ``--benchmark-skip``); None elsewhere."""
    if not hasattr(config, "workerinput"):
        return None
    session = getattr(config, "_benchmarksession", None)
    if session is None or not getattr(session, "xdist_warning", False) or not session.disabled:
        return None
    return session


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """An amp-harness timing test in a worker runs with pytest-benchmark on; what it recorded is
    taken out of the worker's pytest-benchmark session (which writes nothing itself) for the
    controller's."""
    session = _xdist_disabled_it(item.config)
    if session is None or not is_ours(item) or not is_timing(item):
        return (yield)
    before = len(session.benchmarks)
    session.disabled = False
    try:
        return (yield)
    finally:
        session.disabled = True
        recorded = session.benchmarks[before:]
        del session.benchmarks[before:]
        shipped = item.config.stash.setdefault(_SHIPPED, [])
        shipped += [m.as_dict(include_data=True) for m in recorded if m and not m.has_error]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker sends its amp-harness timing tests' pytest-benchmark results to the controller."""
    shipped = session.config.stash.get(_SHIPPED, [])
    if shipped and hasattr(session.config, "workeroutput"):
        session.config.workeroutput[BENCHMARKS_KEY] = shipped


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: a worker's results join the controller's pytest-benchmark session, which
    writes the JSON, saves, compares and prints the table as a serial run's does."""
    shipped = getattr(node, "workeroutput", {}).get(BENCHMARKS_KEY)
    session = getattr(node.config, "_benchmarksession", None)
    if shipped and session is not None:
        session.benchmarks.extend(received(d) for d in shipped)


def received(d: dict[str, Any]) -> Any:
    """One shipped result as pytest-benchmark's own ``Metadata``, its statistics recomputed from
    the rounds' data (a cProfile, when one was taken, stays in the worker)."""
    from pytest_benchmark.stats import Metadata

    fixture = SimpleNamespace(
        name=d["name"],
        fullname=d["fullname"],
        group=d["group"],
        param=d["param"],
        params=d["params"],
        extra_info=d["extra_info"],
        cprofile_stats=None,
        has_error=False,
    )
    stats = d["stats"]
    metadata = Metadata(fixture, stats["iterations"], d["options"])  # type: ignore[no-untyped-call]
    for duration in stats["data"]:
        metadata.stats.update(duration)  # type: ignore[no-untyped-call]
    return metadata
