"""The shape of harness/ is enforced: `lint-imports` (run by .ci/run) fails when a lower layer
imports a higher one, when two modules import each other round a circle, when a claim family uses
one above it, or when a layer below the plugin imports pytest; a function-local import says why it
is one; docs/architecture.md names every module; the README's front page stays short."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from harness.domains.families import NOT_FAMILIES

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
            "domains/engines/bench/bench.py",
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
        (  # a function-local import is an import: the circle numerics.formats <-> numerics.rounding
            "numerics/formats.py",
            "def _f() -> None:\n    from harness.numerics import rounding as _r",
            "No cycles are allowed in harness.numerics",
        ),
        (  # the engines serve the families: the training loop may not use one
            "domains/engines/training/loop.py",
            "from harness.domains.fp8 import recipes as _r",
            "harness.domains.engines is not allowed to import harness.domains.fp8",
        ),
        (  # no family imports another: fp8 trains through the engine, not the training family
            "domains/fp8/training.py",
            "from harness.domains.training import check as _c",
            "harness.domains.fp8 is not allowed to import harness.domains.training",
        ),
        (  # block-scaled formats share float8's budgets through the scaled engine, not the fp8 family
            "domains/block_scaled/blocktraining.py",
            "from harness.domains.fp8 import linear as _l",
            "harness.domains.block_scaled is not allowed to import harness.domains.fp8",
        ),
        (  # ... nor the other way round, on any level
            "domains/training/check.py",
            "from harness.domains.fp8 import recipes as _r",
            "harness.domains.training is not allowed to import harness.domains.fp8",
        ),
        (
            "domains/scaler/clipping.py",
            "from harness.domains.autocast import oracle as _o",
            "harness.domains.scaler is not allowed to import harness.domains.autocast",
        ),
        (  # the core of the reproductions never reaches for the registry of registries
            "domains/repro.py",
            "from harness.domains import known_issues as _k",
            "harness.domains.repro is not allowed to import harness.domains.known_issues",
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


def _modules() -> list[Path]:
    """Every module of harness/ (the known issues' scripts are package data, not modules)."""
    root = REPO / "harness"
    return sorted(
        p for p in root.rglob("*.py") if p.name != "__init__.py" and not {"issue_scripts", "scripts"} & set(p.parts)
    )


def test_the_architecture_page_names_every_module():
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = [
        str(p.relative_to(REPO / "harness")) for p in _modules() if str(p.relative_to(REPO / "harness")) not in page
    ]
    assert not missing, f"docs/architecture.md does not name {missing}: say where each belongs"


def _local_harness_imports(path: Path) -> list[tuple[int, str]]:
    """(line, text) of each import of harness inside a function body of ``path``."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if inside and isinstance(child, ast.ImportFrom) and (child.module or "").startswith("harness"):
                found.append((child.lineno, lines[child.lineno - 1]))
            if inside and isinstance(child, ast.Import) and any(a.name.startswith("harness") for a in child.names):
                found.append((child.lineno, lines[child.lineno - 1]))
            visit(child, local)

    visit(ast.parse(source), False)
    return found


def test_every_function_local_import_of_the_harness_says_why():
    """Function-local imports hide the graph a reader sees at a module's top; one is kept only to
    spare an import cost (torch, pandas) and says so on its line (``# lazy: ...``)."""
    unexplained = [
        f"{p.relative_to(REPO)}:{n}: {text.strip()}"
        for p in _modules()
        for n, text in _local_harness_imports(p)
        if "# lazy:" not in text
    ]
    assert not unexplained, unexplained


def test_the_local_import_check_sees_an_unexplained_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from harness.numerics import formats\n    return formats\n", encoding="utf-8")
    assert _local_harness_imports(module) == [(2, "    from harness.numerics import formats")]


def test_the_readme_front_page_stays_within_200_lines():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move detail into docs/"


#: every claim family's parts: what turns its failures into scripts, and the scripts themselves
FAMILY_PARTS = ("repro.py", "scripts")
#: the packages of harness/domains that are not claim families: the shared layer below them
SHARED = tuple(sorted(NOT_FAMILIES))


def _family_gaps(domains: Path, suites: Path) -> dict[str, list[str]]:
    """Per claim family (a package under ``domains``), the parts of the family template it lacks:
    ``repro.py``, ``scripts/`` with a script, a suite folder of its own name, and ``known_issues.py``
    exactly where it keeps ``issue_scripts/``."""
    gaps: dict[str, list[str]] = {}
    for family in sorted(p for p in domains.iterdir() if (p / "__init__.py").is_file() and p.name not in SHARED):
        missing = [part for part in FAMILY_PARTS if not (family / part).exists()]
        if (family / "scripts").is_dir() and not any((family / "scripts").glob("*.py")):
            missing.append("a script in scripts/")
        if not (suites / family.name).is_dir():
            missing.append(f"suites/{family.name}/ (one name for suite and domain)")
        if (family / "issue_scripts").is_dir() != (family / "known_issues.py").is_file():
            missing.append("known_issues.py beside issue_scripts/ (both or neither)")
        if missing:
            gaps[family.name] = missing
    return gaps


def test_every_claim_family_has_the_family_template():
    gaps = _family_gaps(REPO / "harness" / "domains", REPO / "suites")
    assert not gaps, f"claim families missing parts of the template (docs/architecture.md): {gaps}"


def test_a_family_missing_a_part_of_the_template_is_named(tmp_path):
    domains, suites = tmp_path / "domains", tmp_path / "suites"
    shutil.copytree(REPO / "harness" / "domains", domains, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "suites", suites, ignore=shutil.ignore_patterns("__pycache__"))
    (domains / "patterns" / "repro.py").unlink()
    shutil.rmtree(suites / "memory")
    (domains / "scaler" / "known_issues.py").unlink()
    assert _family_gaps(domains, suites) == {
        "memory": ["suites/memory/ (one name for suite and domain)"],
        "patterns": ["repro.py"],
        "scaler": ["known_issues.py beside issue_scripts/ (both or neither)"],
    }


#: the plugin's entry module: hooks only, at most this many lines (issue #80)
HOOKS_LINES = 300


def test_the_plugin_entry_module_stays_a_list_of_hooks():
    lines = (REPO / "harness" / "pytest_plugin" / "hooks.py").read_text(encoding="utf-8").count("\n")
    assert lines <= HOOKS_LINES, f"harness/pytest_plugin/hooks.py has {lines} lines: move helpers beside it"


def _spec_strings(roots: list[Path]) -> dict[str, list[str]]:
    """Every string literal of the form ``"harness.x.y:name"`` or ``"torch.x:name"`` (a function
    passed by name, as the spawned ranks and the negative controls take them), by where it is."""
    import ast
    import re

    spec = re.compile(r"^(harness|torch)(\.\w+)*:[A-Za-z_]\w*$")
    found: dict[str, list[str]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if "scripts" in path.parts or "issue_scripts" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and spec.match(node.value):
                    found.setdefault(node.value, []).append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_every_function_named_by_a_module_function_string_exists():
    """A ``"module:function"`` string is a reference no import contract sees: each must resolve
    (issue #80), FSDP2's names where the running release keeps them."""
    from harness.domains.engines.ranks.ranks import resolve

    found = _spec_strings([REPO / "harness", REPO / "suites"])
    assert len(found) >= 5, found  # torch's FSDP2 names and collectives, the scaler and interconnect programs
    missing = []
    for spec, where in sorted(found.items()):
        try:
            resolve(spec)
        except (ImportError, AttributeError, AssertionError) as e:
            missing.append(f"{spec} ({', '.join(where)}): {e}")
    assert not missing, "\n".join(missing)


def test_a_module_function_string_that_names_nothing_is_caught(tmp_path):
    (tmp_path / "m.py").write_text('SPEC = "harness.domains.engines.ranks.ranks:no_such_program"\n', encoding="utf-8")
    found = _spec_strings([tmp_path])
    assert list(found) == ["harness.domains.engines.ranks.ranks:no_such_program"]
    from harness.domains.engines.ranks.ranks import resolve

    with pytest.raises(AttributeError, match="no_such_program"):
        resolve("harness.domains.engines.ranks.ranks:no_such_program")


#: the capability any family's suite may decide beside its own: a timing is a speed claim whichever
#: family owns it (fp8's and compiled's speedups), so that ``--optional speed`` leaves every timing
#: out on a shared host (docs/architecture.md, "Who owns a claim")
SPEED = "speed"


def _capability_gaps(domains: Path, suites: Path) -> list[str]:
    """What breaks "one capability per family": a family declaring none or several without saying
    why, a capability two families declare, a suite file deciding what its family does not."""
    import re

    from harness.domains import families

    gaps: list[str] = []
    declared = {family: families.declared(family, domains) for family in families.names(domains)}
    every = {cap for d in declared.values() for cap in d.capabilities}
    owner: dict[str, str] = {}
    for family, d in declared.items():
        if len(d.capabilities) != 1 and not d.note:
            gaps.append(f"{family}: declares {len(d.capabilities)} capabilities and no CAPABILITY_NOTE saying why")
        for cap in d.capabilities:
            if cap in owner:
                gaps.append(f"{family}: capability {cap!r} is already {owner[cap]}'s")
            owner.setdefault(cap, family)
        allowed = {*d.capabilities, SPEED}
        for path in sorted((suites / family).glob("test_*.py")):
            for cap in re.findall(r'amp_capability\("([^"]+)"\)', path.read_text(encoding="utf-8")):
                if d.capabilities and cap not in allowed:
                    gaps.append(f"suites/{family}/{path.name}: decides {cap!r}, not its family's {d.capabilities}")
                elif cap not in every:
                    gaps.append(f"suites/{family}/{path.name}: decides {cap!r}, which no family declares")
    return gaps


def test_every_family_decides_one_capability_or_says_why():
    from harness.domains import capabilities, families

    assert not _capability_gaps(REPO / "harness" / "domains", REPO / "suites")
    declared = [c for f in families.names() for c in families.declared(f).capabilities]
    assert tuple(declared) == capabilities.CAPABILITIES


def test_a_family_without_its_capability_is_named(tmp_path):
    domains, suites = tmp_path / "domains", tmp_path / "suites"
    shutil.copytree(REPO / "harness" / "domains", domains, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "suites", suites, ignore=shutil.ignore_patterns("__pycache__"))
    init = domains / "memory" / "__init__.py"
    init.write_text(init.read_text(encoding="utf-8").replace('CAPABILITY = "memory"', ""), encoding="utf-8")
    sr = suites / "stochastic_rounding" / "test_stochastic_rounding.py"
    sr.write_text(sr.read_text(encoding="utf-8").replace('"stochastic rounding"', '"fp8"'), encoding="utf-8")
    gaps = _capability_gaps(domains, suites)
    assert any(g.startswith("memory: declares 0 capabilities") for g in gaps), gaps
    assert any("test_stochastic_rounding.py: decides 'fp8'" in g for g in gaps), gaps


def _docstring_names(package: Path, after: str | None = None) -> set[str]:
    """The names a package docstring lists: after ``after`` up to the next blank line (a plain
    comma list), else every ````name```` in its first paragraph."""
    import re

    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    if after is not None:
        listed = doc.split(after, 1)[1].split("\n\n", 1)[0].split("(", 1)[0]
        return {n.strip() for n in re.split(r"[,\s]+", listed) if n.strip()}
    return set(re.findall(r"``(\w+)``", doc.split("\n\n")[1] if "\n\n" in doc else doc))


def test_package_docstrings_list_what_the_folders_hold():
    from harness.domains import families

    domains = REPO / "harness" / "domains"
    assert _docstring_names(domains, "Claim families:") == set(families.names())
    engines = domains / "engines"
    held = {
        p.stem
        for p in engines.iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())
    }
    assert {n for n in _docstring_names(engines) if n in held or (engines / n).exists()} == held
    assert _docstring_names(engines) <= held, _docstring_names(engines) - held


#: the layer each package's docstring names, counted from the bottom of pyproject.toml's layers
#: contract (harness/__init__.py lists them in that order)
def test_each_layer_package_says_which_layer_it_is():
    import re

    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"][
        "contracts"
    ]
    layers = next(c["layers"] for c in contracts if c["name"].startswith("harness layers"))
    for number, package in enumerate(reversed(layers), start=1):
        doc = ast.get_docstring(
            ast.parse((REPO / package.replace(".", "/") / "__init__.py").read_text(encoding="utf-8"))
        )
        said = re.match(r"Layer (\d)", doc or "")
        assert said and int(said.group(1)) == number, f"{package}: its docstring should begin 'Layer {number}'"


#: the ranks engine keeps the launcher and the world; each family's rank programs live at home (#80);
#: 412 since the launcher gives a process group's teardown its grace and ranks report atomically
RANKS_ENGINE_LINES = 412


def test_the_ranks_engine_holds_the_launcher_only():
    engine = REPO / "harness" / "domains" / "engines" / "ranks"
    lines = sum(p.read_text(encoding="utf-8").count("\n") for p in engine.glob("*.py"))
    assert lines <= RANKS_ENGINE_LINES, (
        f"harness/domains/engines/ranks has {lines} lines: rank programs go to their family"
    )


def _suites_importing_other_families(suites: Path) -> list[str]:
    """Imports of another claim family's modules in a suite folder (function-local ones too): a
    suite states its family's claims; what two families share lives in an engine or the top."""
    from harness.domains import families

    names = set(families.names())
    found = []
    for path in sorted(suites.rglob("*.py")):
        own = path.relative_to(suites).parts[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if isinstance(node, ast.ImportFrom) and node.module == "harness.domains":
                modules = [f"harness.domains.{a.name}" for a in node.names]
            for m in modules:
                parts = m.split(".")
                if parts[:2] == ["harness", "domains"] and len(parts) > 2 and parts[2] in names and parts[2] != own:
                    found.append(f"{path.relative_to(suites.parent)}:{node.lineno} imports {m}")
    return found


def test_no_suite_imports_another_familys_modules():
    assert not _suites_importing_other_families(REPO / "suites")


def test_a_suite_importing_another_family_is_named(tmp_path):
    (tmp_path / "suites" / "fp8").mkdir(parents=True)
    (tmp_path / "suites" / "fp8" / "test_x.py").write_text(
        "def test_x():\n    from harness.domains.compiled import runs\n", encoding="utf-8"
    )
    assert _suites_importing_other_families(tmp_path / "suites") == [
        "suites/fp8/test_x.py:2 imports harness.domains.compiled"
    ]


#: ``compare_claim`` calls the suites may keep: a claim whose rule is the comparison itself (a
#: count against a baseline, an exception raised); every other verdict is decided in its family's
#: domain and returned typed (#80)
SUITE_CLAIMS = 20


def _claim_calls(suites: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in sorted(suites.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        n = sum(
            isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "compare_claim"
            for node in ast.walk(tree)
        )
        if n:
            counts[str(path.relative_to(suites.parent))] = n
    return counts


def test_verdicts_are_decided_in_the_domains_not_the_suites():
    counts = _claim_calls(REPO / "suites")
    assert sum(counts.values()) <= SUITE_CLAIMS, (
        f"{sum(counts.values())} compare_claim calls in suites/ (at most {SUITE_CLAIMS}): move the verdict into "
        f"harness/domains/<family>/ and return the claim from there; by file: {counts}"
    )


def _fault_module_gaps(faults: Path, family_names: tuple[str, ...]) -> list[str]:
    """One ``tests/faults/<family>.py`` per claim family, and no module that is not a family's but
    the installer (``stacks``): a fault lives with the family whose checks it must fail."""
    held = {p.stem for p in faults.glob("*.py")} - {"__init__", "stacks"}
    return [f"no tests/faults/{f}.py" for f in family_names if f not in held] + [
        f"tests/faults/{m}.py names no claim family" for m in sorted(held - set(family_names))
    ]


def test_every_family_has_one_fault_module():
    from harness.domains import families

    assert not _fault_module_gaps(REPO / "tests" / "faults", families.names())


def test_a_missing_or_stray_fault_module_is_named(tmp_path):
    from harness.domains import families

    shutil.copytree(REPO / "tests" / "faults", tmp_path / "faults", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "faults" / "memory.py").rename(tmp_path / "faults" / "bytes.py")
    assert _fault_module_gaps(tmp_path / "faults", families.names()) == [
        "no tests/faults/memory.py",
        "tests/faults/bytes.py names no claim family",
    ]


def test_the_suite_claim_count_sees_every_call(tmp_path):
    (tmp_path / "suites" / "x").mkdir(parents=True)
    (tmp_path / "suites" / "x" / "test_x.py").write_text(
        "from harness.numerics import comparison as c\nfrom harness.numerics.comparison import compare_claim\n"
        "a = compare_claim('a', 1, True, 'x')\nb = c.compare_claim('b', 1, True, 'x')\n",
        encoding="utf-8",
    )
    assert _claim_calls(tmp_path / "suites") == {"suites/x/test_x.py": 2}
