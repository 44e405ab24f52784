"""Shared pieces of the harness's own tests (imported by name: ``from helpers import ...``)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SUITES = REPO / "suites"
TESTS = Path(__file__).resolve().parent

#: Options of every in-process run of a copied suite: no cache, no report, CPU, the
#: first-counterexample hypothesis profile of fault_injection.py, failures listed; harness
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


def inject(pytester: pytest.Pytester, family: str, body: str) -> None:
    """Write ``suites/<family>/conftest.py`` in the scratch directory with a fault injected
    (``family=""`` writes ``suites/conftest.py``, above a suite's own conftest, which then stays)."""
    d = pytester.path / "suites" / family
    d.mkdir(parents=True, exist_ok=True)
    (d / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n{body}", encoding="utf-8")


def patch_conftest(target: str, factory: str) -> str:
    """conftest source that, around every test, replaces ``target`` (a dotted attribute such as
    ``torch.nn.functional.linear``) by ``fault_injection.<factory>(original)``."""
    module, _, attr = target.rpartition(".")
    return (
        "import pytest, torch, torch.nn.functional\nimport fault_injection as fi\n\n"
        "@pytest.fixture(autouse=True)\n"
        "def regression(monkeypatch):\n"
        f"    monkeypatch.setattr({module}, {attr!r}, fi.{factory}({target}))\n"
    )
