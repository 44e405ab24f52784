"""Shared pieces of the harness's own tests (imported by name: ``from helpers import ...``)."""

from __future__ import annotations

import ast
import builtins
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.numerics.verdict import Outcome

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"
BASELINES = REPO / "baselines"
TESTS = Path(__file__).resolve().parent

#: Options of every in-process run of a copied suite: no cache, no report, CPU, the
#: first-counterexample hypothesis profile of faults/__init__.py, failures listed; harness
#: modules are imported by the outer run already, so the inner run cannot rewrite them, and the
#: real suite modules are imported under their basenames already (hence importlib mode).
INNER_ARGS = (
    "-p",
    "no:cacheprovider",
    "--amp-no-report",
    "--hypothesis-profile=negative-control",
    "--amp-device=cpu",
    "-rf",
    "-W",
    "ignore::pytest.PytestAssertRewriteWarning",
    "--import-mode=importlib",
)
#: what an xdist worker's environment says about it: an inner run is a serial session of its own
#: (pytest-benchmark reads these and disables itself)
XDIST_WORKER_ENVIRON = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")


def project_configuration(pytester: pytest.Pytester) -> None:
    """The project's own pytest configuration in the scratch directory: ``[tool.pytest.ini_options]``
    of its pyproject.toml as it stands, addopts (two xdist workers) included, less ``testpaths``
    (a scratch project's tests are where its runs name them). A run there is a run as users start
    one from the repository."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    start = text.index("[tool.pytest.ini_options]")
    end = text.index("\n[tool.", start)
    lines = [line for line in text[start:end].splitlines() if not line.startswith("testpaths")]
    (pytester.path / "pyproject.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")


def outside_this_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A child pytest started from a test is a session of its own, not a worker of this run (xdist
    and pytest-benchmark read these variables)."""
    for name in XDIST_WORKER_ENVIRON:
        monkeypatch.delenv(name, raising=False)


#: every fault module, each family's and the installer, imported by an injected conftest: one
#: ``tests/faults/<family>.py`` per claim family (tests/test_architecture.py holds them to the families)
FAULT_MODULES = tuple(f"faults.{p.stem}" for p in sorted((TESTS / "faults").glob("*.py")) if p.stem != "__init__")


def conftest_source(
    *,
    fixtures: Mapping[str, str] | None = None,
    patches: Mapping[str, str] | None = None,
    imports: tuple[str, ...] = (),
    kernels: tuple[str, ...] = (),
) -> str:
    """The text of an injected conftest, built in this one place.

    ``fixtures``: fixture name -> the Python expression it returns (``faults`` is importable), e.g.
    ``{"scaler_factory": "faults.scaler.BROKEN_SCALERS['NeverBacksOff']"}``.
    ``patches``: dotted attribute -> dotted name of a fault factory; around every test the attribute
    is replaced by ``factory(original)``, e.g. ``{"torch.mm": "faults.autocast.float64_cast"}``.
    ``kernels``: names of ``faults.stacks.KERNELS`` registered around every test (dispatcher faults).
    """
    lines = [
        "import pathlib",
        "import sys",
        f"sys.path.insert(0, {str(TESTS)!r})",
        "import pytest",
        "import torch",
        "import torch.nn.functional",
        f"import {', '.join(FAULT_MODULES)}",
        "import harness.domains.autocast.oracle",
        *(f"import {module}" for module in imports),
        "",
    ]
    for name, expression in (fixtures or {}).items():
        lines += ["@pytest.fixture", f"def {name}():", f"    return {expression}", ""]
    if patches:
        lines += ["@pytest.fixture(autouse=True)", "def injected_faults(monkeypatch):"]
        for target, factory in patches.items():  # resolved by import: a module torch hides (torch.optim.sgd) too
            owner, _, attr = target.rpartition(".")
            lines.append(
                f"    monkeypatch.setattr(faults.stacks.resolve({owner!r}), {attr!r}, "
                f"{factory}(faults.stacks.resolve({target!r})))"
            )
        lines.append("")
    if kernels:
        lines += [
            "import faults.stacks",
            "@pytest.fixture(autouse=True)",
            "def injected_kernels():",
            f"    libs = [faults.stacks.register(k) for k in {kernels!r}]",
            "    yield",
            "    for lib in libs:",
            "        lib._destroy()",
            "",
        ]
    return "\n".join(lines)


def inject(
    pytester: pytest.Pytester,
    family: str,
    *,
    fixtures: Mapping[str, str] | None = None,
    patches: Mapping[str, str] | None = None,
    imports: tuple[str, ...] = (),
    kernels: tuple[str, ...] = (),
) -> None:
    """Write ``suites/<family>/conftest.py`` in the scratch directory with faults injected
    (``family=""`` writes ``suites/conftest.py``, above a suite's own conftest, which then stays)."""
    d = pytester.path / "suites" / family
    d.mkdir(parents=True, exist_ok=True)
    (d / "conftest.py").write_text(
        conftest_source(fixtures=fixtures, patches=patches, imports=imports, kernels=kernels), encoding="utf-8"
    )


# -- negative controls: one way to say a fault was caught -------------------------------------------
#: row outcomes that mean a check did not judge: a failure carrying only these proves nothing
NOT_JUDGED = frozenset(o.value for o in Outcome if not o.judged and o is not Outcome.SKIP)


@dataclass(frozen=True)
class InnerRun:
    """One in-process run of copied suite files: the test ids by outcome and the rows recorded."""

    result: pytest.RunResult
    passed: frozenset[str]
    #: failed in their call, or errored in setup or teardown, or failed to collect
    failed: frozenset[str]
    skipped: frozenset[str]
    rows: tuple[dict[str, Any], ...]

    @property
    def stdout(self) -> Any:
        return self.result.stdout

    def text(self, tail: int = 4000) -> str:
        return str(self.result.stdout.str())[-tail:]


def run_inner(pytester: pytest.Pytester, *args: str) -> InnerRun:
    """``pytester.runpytest(*INNER_ARGS, *args)``, read back as an :class:`InnerRun` (a run given
    ``--amp-report-dir`` writes its report)."""
    from harness.pytest_plugin.state import STATE

    wants_report = any(a.startswith("--amp-report-dir") for a in args)
    base = [a for a in INNER_ARGS if not (wants_report and a == "--amp-no-report")]
    with pytest.MonkeyPatch.context() as env:  # a serial session, also inside an xdist worker
        outside_this_run(env)
        result = pytester.runpytest(*base, *args)
    reprec = result.reprec  # type: ignore[attr-defined]
    passed, skipped, failed = reprec.listoutcomes()
    finishes = reprec.getcalls("pytest_sessionfinish")
    rows: tuple[dict[str, Any], ...] = ()
    if finishes and STATE in finishes[0].session.config.stash:
        rows = tuple(finishes[0].session.config.stash[STATE].rows)
    return InnerRun(
        result,
        frozenset(r.nodeid for r in passed),
        frozenset(r.nodeid for r in failed),
        frozenset(r.nodeid for r in skipped),
        rows,
    )


def assert_caught(run: InnerRun, *expected: str) -> None:
    """The injected fault was caught, and by the checks named for it.

    ``expected``: fnmatch patterns of the test ids that must fail. Each pattern matches a failed
    test, every failed test matches a pattern (nothing else broke), and every failed test failed
    on a judged verdict: a test whose rows are only noisy, unjudged or inconclusive did not
    catch anything.
    """
    __tracebackhide__ = True
    assert expected, "name the tests that must fail"
    unmatched = [p for p in expected if not any(fnmatch.fnmatchcase(t, p) for t in run.failed)]
    extra = sorted(t for t in run.failed if not any(fnmatch.fnmatchcase(t, p) for p in expected))
    assert not unmatched and not extra, (
        f"expected failures {list(expected)}; not failed: {unmatched}; failed besides: {extra}; "
        f"passed: {sorted(run.passed)}; skipped: {sorted(run.skipped)}\n{run.text()}"
    )
    for test in sorted(run.failed):
        outcomes = {str(r["outcome"]) for r in run.rows if r["nodeid"] == test}
        judged = "fail" in outcomes or not outcomes & NOT_JUDGED
        assert judged, f"{test} failed on rows that judged nothing ({sorted(outcomes)}): not a catch\n{run.text()}"


def assert_clean(run: InnerRun, at_least: int) -> None:
    """A fault-free run: nothing failed, and at least ``at_least`` checks passed (skips do not count)."""
    __tracebackhide__ = True
    assert not run.failed, f"a clean run failed: {sorted(run.failed)}\n{run.text()}"
    assert len(run.passed) >= at_least, (
        f"a clean run passed {len(run.passed)} checks, fewer than the {at_least} it must show passing; "
        f"skipped: {sorted(run.skipped)}\n{run.text()}"
    )


# -- standalone scripts ------------------------------------------------------------------------------
def unbound_names(script: str) -> set[str]:
    """Names ``script`` reads that it binds nowhere and that are not builtins: a standalone script
    rendered from blocks that lost an import (``time`` read by a timing block whose imports were
    left to another fill) fails only when it runs, and most scripts run in the thorough tier only.
    Flow-insensitive: a name bound anywhere counts as bound everywhere."""
    tree = ast.parse(script)
    bound = set(dir(builtins)) | {"__file__", "__name__"}
    loaded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound |= set(node.names)
    return loaded - bound


def fresh_driver(prelude: str = "", scope: str = "contextlib.nullcontext") -> str:
    """Source for ``python -I -c``: one fresh interpreter runs ``prelude`` (e.g. importing the
    faults it will install: a family's fault module may use the harness), then, unable to import
    ``harness`` from then on, each script named in ``sys.argv[1:]`` inside ``scope(path)`` (a
    context manager the prelude may define: a stack for that script alone), and prints
    ``CODES {path: exit status}``."""
    return f"""
import contextlib, json, runpy, sys
{prelude}
for _name in [m for m in sys.modules if m == "harness" or m.startswith("harness.")]:
    del sys.modules[_name]  # the faults keep what they imported; the scripts cannot import it
sys.modules["harness"] = None  # the scripts must stand alone
codes = {{}}
for path in sys.argv[1:]:
    try:
        with {scope}(path):
            runpy.run_path(path, run_name="__main__")
        codes[path] = 0
    except SystemExit as exit:
        codes[path] = int(exit.code or 0)
print("CODES " + json.dumps(codes))
"""


def faulty_driver(faults_of: dict[str, list[str]]) -> str:
    """:func:`fresh_driver` running each script on the faulty stacks ``faults_of`` names for it
    (``faults.stacks``, installed for that script only and removed after; none: the clean stack)."""
    if not any(faults_of.values()):
        return fresh_driver()
    return fresh_driver(
        f"""sys.path.insert(0, {str(TESTS)!r})
from faults import stacks
FAULTS = {faults_of!r}
for _fault in {{f for faults in FAULTS.values() for f in faults}}:
    stacks.load(_fault)  # its family's module imported now, while the harness may be
def stack(path):
    scope = contextlib.ExitStack()
    for fault in FAULTS[path]:
        scope.enter_context(stacks.installed(fault))
    return scope""",
        scope="stack",
    )
