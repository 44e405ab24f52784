"""The families' reproduction scripts are real files that stand alone, and no template hides in a
Python string.

Each ``harness/domains/<family>/scripts/*.py`` runs as it lies, on its defaults, with torch alone:
one isolated interpreter runs them all in turn (``runpy``: each in fresh globals) and checks that
none imported the harness (the standalone-scripts tier, which CI runs). They are linted and type-checked with the package (``ruff``, ``mypy
--strict harness/`` in .ci/run), which no tool does for a template inside a string; no string of
more than ten lines outside a docstring is left in harness/.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from harness.domains.repro import ScriptTemplate

REPO = Path(__file__).resolve().parents[1]
#: the scripts that fork ranks run first: forking after torch.compile's worker threads can hang
SCRIPTS = sorted(
    [
        *(REPO / "harness" / "domains").glob("*/scripts/*.py"),
        *(REPO / "harness" / "domains").glob("engines/*/scripts/*.py"),
    ],
    key=lambda p: ("start_processes(" not in p.read_text(encoding="utf-8"), str(p)),
)

#: a string longer than this many lines that is not a docstring is a template (issue #70's bound)
TEMPLATE_LINES = 10


def _templates(path: Path) -> list[int]:
    """The first lines of ``path``'s strings over :data:`TEMPLATE_LINES` lines, docstrings aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))  # a docstring
        if isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in ast.walk(node) if part is not node)
    return [
        n.lineno
        for n in ast.walk(tree)
        if id(n) not in skip
        and (isinstance(n, ast.JoinedStr) or (isinstance(n, ast.Constant) and isinstance(n.value, str)))
        and (n.end_lineno or n.lineno) - n.lineno + 1 > TEMPLATE_LINES
    ]


def test_no_template_longer_than_ten_lines_hides_in_a_python_string():
    found = {
        str(p.relative_to(REPO)): lines
        for p in sorted((REPO / "harness").rglob("*.py"))
        if "scripts" not in p.parts and "issue_scripts" not in p.parts
        for lines in [_templates(p)]
        if lines
    }
    assert not found, f"templates in strings (move them into the family's scripts/ as real files): {found}"


def test_a_template_in_a_string_is_found(tmp_path):
    module = tmp_path / "m.py"
    body = "\n".join(f"x{i} = {i}" for i in range(TEMPLATE_LINES + 1))
    module.write_text(f'"""A docstring\n{body}\n"""\n\nCODE = f"""\n{body}\n"""\nSHORT = """a\nb"""\n')
    assert _templates(module) == [TEMPLATE_LINES + 5]  # CODE, after the docstring and a blank line


@pytest.mark.standalone_scripts
@pytest.mark.amp_thorough  # the scripts' trainings, compiles and forked ranks: seconds on 2 cores
def test_every_script_runs_as_it_lies_on_torch_alone():
    assert SCRIPTS, "no family scripts found"
    runner = (
        "import runpy, sys\n"
        f"for path in {[str(p) for p in SCRIPTS]!r}:\n"
        "    try:\n"
        "        runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as e:\n"
        "        assert e.code in (0, 1, None), (path, e.code)\n"
        "    print('@@ran@@', path, flush=True)\n"
        "assert not any(m == 'harness' or m.startswith('harness.') for m in sys.modules), 'imported the harness'\n"
    )
    # -I: no user site, no PYTHONPATH, no current directory: the harness is not importable by accident
    done = subprocess.run([sys.executable, "-I", "-c", runner], capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("@@ran@@ ") == len(SCRIPTS), done.stdout  # a marker no script prints


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.parent.name}/{p.stem}")
def test_each_scripts_blocks_are_named_and_its_parameters_written_over(script):
    package = ".".join(script.relative_to(REPO).parent.parent.parts)
    template = ScriptTemplate(package, script.stem)
    names = [n for n in template.blocks() if n]
    assert names, f"{script.name} has no '# -- <block> --' markers"
    with pytest.raises(ValueError, match="no parameter"):
        template.fill(*names, values={"NO_SUCH_PARAMETER": "1"})
    with pytest.raises(ValueError, match="no block"):
        template.fill("no_such_block")


def test_the_unbound_name_check_sees_an_import_a_script_lost():
    """The guard the failed checks' scripts pass by default (tests/helpers.py): a timing block
    rendered without the imports another fill kept reads ``time`` bound nowhere."""
    from helpers import unbound_names

    lost = "import torch\n\n\ndef per_call(fn):\n    begin = time.thread_time()\n    fn()\n    return begin\n"
    assert unbound_names(lost) == {"time"}
    assert not unbound_names("import time\n" + lost)
    kept = "import torch as T\nfrom x import y as z\n\n\ndef f(a, *b, c=1, **d):\n    try:\n        return [e for e in b]\n    except ValueError as err:\n        return a, c, d, z, T, err, len\n"
    assert not unbound_names(kept)
