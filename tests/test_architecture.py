"""The layers of harness/ are enforced: `lint-imports` (run by .ci/run) fails when a lower layer
imports a higher one, or when a layer below the plugin imports pytest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
pytestmark = pytest.mark.skipif(LINT is None, reason="import-linter is missing: pip install -e '.[dev]'")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT)], cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False)


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    return tmp_path


def test_the_layers_of_the_shipped_tree_are_kept(tmp_path):
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        (
            "numerics/formats.py",
            "from harness.apps import cli as _cli",
            "harness.numerics is not allowed to import harness.apps",
        ),
        (
            "domains/speed/bench.py",
            "from harness.storage import report as _r",
            "harness.domains is not allowed to import harness.storage",
        ),
        (
            "platform/kernels.py",
            "from harness.domains.speed import bench as _b",
            "harness.platform is not allowed to import harness.domains",
        ),
        (
            "storage/report.py",
            "import pytest as _pytest",
            "numerics, platform, domains and storage never import pytest",
        ),
    ],
)
def test_a_lower_layer_importing_upward_breaks_the_contract(tmp_path, module, line, broken):
    tree = _copy(tmp_path)
    with (tree / "harness" / module).open("a", encoding="utf-8") as fh:
        fh.write(f"\n{line}  # noqa\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert broken in result.stdout, result.stdout[-3000:]
