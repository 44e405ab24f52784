"""The README's example runs as written: its test file, copied verbatim into a fresh project."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

MARKER = re.compile(r"<!-- readme-example: (?P<name>\S+) -->\n```python\n(?P<code>.*?)\n```", re.S)


def _examples() -> dict[str, str]:
    return {m["name"]: m["code"] + "\n" for m in MARKER.finditer((REPO / "README.md").read_text(encoding="utf-8"))}


def test_the_readme_has_its_example():
    assert list(_examples()) == ["test_my_model.py"], "README.md: the example lost its readme-example marker"


def test_the_readme_example_passes_as_written(pytester: pytest.Pytester):
    for name, code in _examples().items():
        (pytester.path / name).write_text(code, encoding="utf-8")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "--amp-no-report", "-W", "ignore::pytest.PytestAssertRewriteWarning"
    )
    result.assert_outcomes(passed=1)


def test_the_public_module_exports_what_a_users_tests_need():
    """Setup, recipes, the check entry points, the scaler conformance machine and adapters, and
    report loading, from one documented module."""
    import harness.api as api

    needed = {"Setup", "Inputs", "BF16", "FP16_SCALER", "check_parity", "check_lane", "conformance_machine"}
    needed |= {"ScalerAdapter", "SCALER_ADAPTERS", "load_report", "find_runs", "Outcome", "KeyKind"}
    assert needed <= set(api.__all__)
    assert all(getattr(api, name) is not None for name in api.__all__)


def test_the_guide_to_writing_checks_imports_only_the_public_module():
    """docs/writing-checks.md is what users copy: every name it imports comes from harness.api, and
    every harness.api name it mentions exists there."""
    import harness.api

    text = (REPO / "docs" / "writing-checks.md").read_text(encoding="utf-8")
    imports = re.findall(r"^\s*from (harness[\w.]*) import", text, re.M)
    assert imports and set(imports) == {"harness.api"}, imports
    for name in re.findall(r"harness\.api\.(\w+)", text):
        assert hasattr(harness.api, name), f"docs/writing-checks.md names harness.api.{name}, which it lacks"
