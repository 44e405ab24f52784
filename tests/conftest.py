"""The harness's own tests. pytester runs the plugin and the real suites in scratch directories."""

from __future__ import annotations

# Imported in the process that runs the tests (:func:`_warm_outer_process`), so that pytester's
# in-process runs (which drop the modules they import when they finish) never unload and re-import
# torch's C extension, and never lose the forkserver that distributed ranks fork from (a new one per
# inner run cost 3 s each).
import importlib
import multiprocessing.forkserver  # noqa: F401
import pkgutil
import shutil
from pathlib import Path
from types import ModuleType

import faults
import pytest
from faults import register_negative_control_profile
from helpers import SUITES

import harness
from harness.storage import report as _report


def _warm_report_imports() -> None:
    """Write and load one report so that every pandas/pyarrow module it needs (pyarrow extension
    types among them, which cannot be registered twice) is imported by the outer process."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        row = _report.make_row(run_id="r", nodeid="n", suite="s", check="c", metric="m", value=1.0)
        assert not _report.load(_report.write(Path(d), "r", [row.as_dict()], {})).run.empty


def _warm_torch_imports() -> None:
    """Call every catalogued op once under autocast, so that torch submodules imported lazily on
    first use (some register operator libraries, which cannot happen twice) stay imported."""
    import torch

    from harness.domains.engines.ops.probe import policy_table

    for dtype in (torch.bfloat16, torch.float16):
        policy_table(torch.device("cpu"), dtype)


def _warm_compile_imports() -> None:
    """Compile one function, forward and backward, under autocast with the fault-free test backend
    (AOTAutograd, no C++: about a second), so that the torch.compile modules it imports (some
    register caches or operator libraries once, at import) are imported by the outer process: every
    injected conftest imports ``faults.compiled``, and pytester's in-process runs drop the modules
    they import. Inductor's own first compile is warmed up by the compiled negative controls."""
    import torch
    import torch._dynamo
    from faults import compiled

    from harness.domains.compiled import nested, runs
    from harness.domains.patterns import checkpointing

    model, x = nested.make(torch.device("cpu"))
    nested.run(runs.compile_fn(nested.call_region, compiled.CLEAN), model, x, torch.bfloat16)
    # Inductor's decompositions and partitioner (the patterns' partitioned cells): their modules
    # register kernel templates at import, which a second import refuses ("duplicate template name")
    nested.run(runs.compile_fn(nested.call_region, checkpointing.PARTITION_BACKEND), model, x, torch.bfloat16)
    torch._dynamo.reset()


def _import_whole(*packages: ModuleType) -> None:
    """Import every module of ``packages`` (the harness, the faults) in the outer process.

    pytester's in-process runs drop the modules they import. A module no earlier run kept is
    therefore imported again by every inner run, through pytest's assertion rewriting (the harness
    is a pytest11 plugin, so its modules are rewritten) and without a bytecode cache where the
    environment disables it: the negative controls paid that for each of some hundreds of runs.
    It also keeps packages coherent: a package kept across runs keeps its attribute to a submodule
    imported in one run after that run drops the submodule, so the next run's ``from package import
    sub`` gets the stale module while a patch of ``package.sub.attr`` patches a new one, and the
    fault misses."""
    for package in packages:
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(info.name)


def _warm_torchao_imports() -> None:
    """Import torchao's modules that register operator libraries at import (its MX training
    kernels, reached lazily by the block-scaled linear), so that an inner run's import is kept."""
    from harness.platform.thirdparty import import_third_party, torchao_missing

    if torchao_missing() is None:
        import_third_party("torchao.prototype.moe_training.mxfp8_linear")
        import_third_party("torchao.prototype.mx_formats.nvfp4_tensor")


def _warm_outer_process() -> None:
    """Everything the inner runs must find imported, imported once here."""
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    import torch  # noqa: F401

    _import_whole(harness, faults)
    _warm_report_imports()
    _warm_torchao_imports()
    _warm_torch_imports()
    _warm_compile_imports()


def _is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands every test to xdist workers and runs none itself: the warm-up
    (imports and two compiles, several seconds before the workers even start) buys it nothing."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", 0))


register_negative_control_profile()

pytest_plugins = ["pytester"]


#: The harness's own tests that start fresh interpreters to run its standalone scripts, and the
#: tests whose output they run. The heavy ones are also ``amp_thorough``: out of the `pytest`
#: budget on 2 cores, run by CI as `pytest tests/ -m standalone_scripts --amp-tier=thorough`.
STANDALONE_SCRIPTS = "standalone_scripts: runs the harness's standalone scripts, or writes those that a later test runs"
#: The tests that run what users run as they run it: the documented commands, and the project's own
#: configuration (two xdist workers from its addopts). In the opt-in tier (each starts pytest or the
#: CLI in fresh interpreters); CI runs them as `pytest tests/ -m as_users_run_it --amp-tier=thorough`.
AS_USERS_RUN_IT = (
    "as_users_run_it: runs a documented command, or the suites under the project's own configuration, as a user would"
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", STANDALONE_SCRIPTS)
    config.addinivalue_line("markers", AS_USERS_RUN_IT)
    if not _is_xdist_controller(config):
        _warm_outer_process()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The harness's own tests are amp-harness tests: its hypothesis profile applies to them."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.amp_harness)


@pytest.fixture
def training_checks():
    """TrainingChecks whose rows stay in a list (``.rows``): no pytest session needed, and tests that
    expect failures leave no FAIL rows in the session's report."""
    import torch

    from harness.domains.training.check import TrainingChecks
    from harness.pytest_plugin.recording import Recorder, TestIdentity

    rows: list = []
    attachments: dict[str, bytes] = {}

    def attach(name: str, data: bytes) -> str:
        attachments[f"attachments/{name}"] = data
        return f"attachments/{name}"

    recorder = Recorder(
        TestIdentity("t", "training", "t"), "run", rows.append, lambda d: "p", lambda o, n: None, attach
    )
    checks = TrainingChecks(recorder, torch.device("cpu"))
    checks.rows = rows  # the rows recorded, for the assertions
    checks.attachments = attachments  # what failed checks saved for their reproductions
    return checks


@pytest.fixture
def suite_copy(pytester: pytest.Pytester):
    """Copy suite files into the scratch directory: ``suite_copy("formats/test_fp8_casts.py")``.

    The copy lands under ``suites/<family>/`` so that the suite name (and baseline paths) match.
    """

    def copy(*relpaths: str, conftest: bool = True) -> Path:
        for rel in relpaths:
            dst = pytester.path / "suites" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(SUITES / rel, dst)
            own = SUITES / Path(rel).parent / "conftest.py"
            if conftest and own.exists():  # the family's own fixtures, where it has any
                shutil.copy(own, dst.parent / "conftest.py")
        return pytester.path / "suites"

    return copy
