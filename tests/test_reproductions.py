"""Every registered known issue ships a standalone reproduction: a script that needs only torch
(and torchao), reproduces the issue on this stack (exit 1) where the registry lists it, and exits 0
with the edit that stands for the upstream fix; run in a fresh interpreter that cannot import this
harness. The compiled issues' scripts compile with Inductor (about 20 s each, with their fixed
variant, on 2 cores): thorough tier."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from helpers import fresh_driver

from harness.apps.cli import main
from harness.domains import known_issues as R
from harness.domains.versions import KnownIssue

#: Runs scripts in one fresh interpreter with ``harness`` blocked: each script's exit status, by path.
DRIVER = fresh_driver()


def _version(issue: KnownIssue) -> str:
    if issue.package == "torch":
        return torch.__version__
    from importlib.metadata import version

    return version(issue.package)


def _run(tmp_path: Path, ids: list[str]) -> dict[str, tuple[int, int]]:
    """Each issue's script and fixed variant, run; issue id -> (exit as is, exit fixed)."""
    paths = []
    for issue_id in ids:
        repro = R.REPRODUCTIONS[issue_id]
        for variant, body in (("as_is", repro.body), ("fixed", repro.fixed_body())):
            path = tmp_path / f"{issue_id.replace('-', '_')}_{variant}.py"
            path.write_text(R.script(issue_id, "the harness's own test", body), encoding="utf-8")
            paths.append(str(path))
    out = subprocess.run(
        [sys.executable, "-I", "-c", DRIVER, *paths], capture_output=True, text=True, timeout=600, check=False
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("CODES ")), None)
    assert line is not None, out.stdout[-3000:] + out.stderr[-3000:]
    codes = json.loads(line.removeprefix("CODES "))
    return {i: (codes[paths[2 * k]], codes[paths[2 * k + 1]]) for k, i in enumerate(ids)}


def test_every_registered_known_issue_has_a_reproduction():
    assert set(R.REPRODUCTIONS) == set(R.REGISTRIES), "register a reproduction with every known issue"


@pytest.mark.parametrize("issue_id", sorted(R.REPRODUCTIONS))
def test_a_reproduction_imports_nothing_of_the_harness(issue_id):
    tree = ast.parse(R.script(issue_id, "test"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "harness" not in imported
    assert imported <= {"sys", "math", *R.REPRODUCTIONS[issue_id].needs}, imported


def _expectations(compiles: bool) -> list[str]:
    ids = [i for i, r in sorted(R.REPRODUCTIONS.items()) if r.compiles is compiles]
    missing = [p for i in ids for p in R.REPRODUCTIONS[i].needs if find_spec(p) is None]
    if missing:
        pytest.skip(f"{', '.join(sorted(set(missing)))} is not installed: the reproductions need it")
    return ids


def _check(tmp_path: Path, ids: list[str]) -> None:
    codes = _run(tmp_path, ids)
    wrong = []
    for issue_id, (as_is, fixed) in codes.items():
        issue = R.REGISTRIES[issue_id][1]
        listed = issue.listed(_version(issue), "cpu")
        if as_is != (1 if listed else 0):
            wrong.append(f"{issue_id}: exit {as_is} as is, the registry {'lists' if listed else 'does not list'} it")
        if fixed != 0:
            wrong.append(f"{issue_id}: exit {fixed} with the fix applied (it could never say fixed)")
    assert not wrong, "\n".join(wrong)


def test_each_reproduction_exits_1_where_the_registry_lists_it_and_0_once_fixed(tmp_path):
    _check(tmp_path, _expectations(compiles=False))


@pytest.mark.amp_thorough
def test_each_compiled_reproduction_exits_1_where_listed_and_0_once_fixed(tmp_path):
    _check(tmp_path, _expectations(compiles=True))


def test_the_command_writes_one_script_per_issue_and_refuses_an_unknown_one(tmp_path, capsys):
    assert main(["repro", "-o", str(tmp_path)]) == 0
    assert sorted(p.stem for p in tmp_path.glob("*.py")) == sorted(i.replace("-", "_") for i in R.REPRODUCTIONS)
    text = (tmp_path / "update_int_new_scale.py").read_text()
    assert text.startswith("# Reproduces update-int-new-scale") and f"torch {torch.__version__}" in text
    assert main(["repro", "--known", "no-such-issue", "-o", str(tmp_path)]) == 2
    assert "no known issue no-such-issue" in capsys.readouterr().err


def test_the_published_scripts_are_the_ones_the_harness_writes():
    """docs/repro/ holds each script as `amp-harness repro -o docs/repro` writes it (docs/findings.md
    links them); only the line saying where it was written may differ."""
    from helpers import REPO

    published = REPO / "docs" / "repro"
    assert sorted(p.stem for p in published.glob("*.py")) == sorted(i.replace("-", "_") for i in R.REPRODUCTIONS)

    def without_provenance(text: str) -> list[str]:
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("# Written on:"))
        end = start + 1
        while end < len(lines) and lines[end].startswith("# ") and not lines[end].startswith("# Needs only"):
            end += 1
        return lines[:start] + lines[end:]

    stale = [
        issue_id
        for issue_id in R.REPRODUCTIONS
        if without_provenance((published / f"{issue_id.replace('-', '_')}.py").read_text())
        != without_provenance(R.script(issue_id, "here"))
    ]
    assert not stale, f"docs/repro is stale for {stale}: regenerate with `amp-harness repro -o docs/repro`"


def test_a_script_that_cannot_run_exits_2_never_1(tmp_path):
    """A missing package or a moved API must not read as "the defect is present"."""
    script = tmp_path / "broken.py"
    script.write_text(R.script("update-int-new-scale", "test", "import not_a_module_anywhere\n"), encoding="utf-8")
    out = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "could not run the reproduction (exit 2)" in out.stderr
