"""Shared pieces of the harness's own tests (imported by name: ``from helpers import ...``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"
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


def conftest_source(*, fixtures: Mapping[str, str] | None = None, patches: Mapping[str, str] | None = None) -> str:
    """The text of an injected conftest, built in this one place.

    ``fixtures``: fixture name -> the Python expression it returns (``faults`` is importable), e.g.
    ``{"scaler_factory": "faults.scalers.BROKEN_SCALERS['NeverBacksOff']"}``.
    ``patches``: dotted attribute -> dotted name of a fault factory; around every test the attribute
    is replaced by ``factory(original)``, e.g. ``{"torch.mm": "faults.autocast.float64_cast"}``.
    """
    lines = [
        "import pathlib",
        "import sys",
        f"sys.path.insert(0, {str(TESTS)!r})",
        "import pytest",
        "import torch",
        "import torch.nn.functional",
        "import faults.autocast, faults.casts, faults.compiled, faults.distributed, faults.scalers, faults.training",
        "import harness.domains.autocast.oracle",
        "",
    ]
    for name, expression in (fixtures or {}).items():
        lines += ["@pytest.fixture", f"def {name}():", f"    return {expression}", ""]
    if patches:
        lines += ["@pytest.fixture(autouse=True)", "def injected_faults(monkeypatch):"]
        for target, factory in patches.items():
            owner, _, attr = target.rpartition(".")
            lines.append(f"    monkeypatch.setattr({owner}, {attr!r}, {factory}({target}))")
        lines.append("")
    return "\n".join(lines)


def inject(
    pytester: pytest.Pytester,
    family: str,
    *,
    fixtures: Mapping[str, str] | None = None,
    patches: Mapping[str, str] | None = None,
) -> None:
    """Write ``suites/<family>/conftest.py`` in the scratch directory with faults injected
    (``family=""`` writes ``suites/conftest.py``, above a suite's own conftest, which then stays)."""
    d = pytester.path / "suites" / family
    d.mkdir(parents=True, exist_ok=True)
    (d / "conftest.py").write_text(conftest_source(fixtures=fixtures, patches=patches), encoding="utf-8")
