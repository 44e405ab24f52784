"""The claim families, read from the tree: every package of ``harness/domains/`` but the shared
engines. A list kept by hand drifted from the folders; this one cannot."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent

#: packages of ``harness/domains/`` that are not claim families: what every family shares
NOT_FAMILIES = frozenset({"engines"})


@functools.cache
def names(root: Path = HERE) -> tuple[str, ...]:
    """The claim families' package names, sorted (``root``: another copy of the domain layer)."""
    return tuple(sorted(p.parent.name for p in root.glob("*/__init__.py") if p.parent.name not in NOT_FAMILIES))


@dataclass(frozen=True)
class Declared:
    """What a family's ``__init__.py`` declares about the qualification: the capabilities its
    suite decides (``CAPABILITY``: a name, or a tuple of them) and, where that is not exactly one
    of its own, why (``CAPABILITY_NOTE``)."""

    family: str
    capabilities: tuple[str, ...]
    note: str


def _literal(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(value)
    return None


@functools.cache
def declared(family: str, root: Path = HERE) -> Declared:
    """The family's declaration, read from its source (no import: the CLI stays light and a
    family's torch imports are not paid to list names)."""
    init = root / family / "__init__.py"
    tree = ast.parse(init.read_text(encoding="utf-8"), str(init))
    raw = _literal(tree, "CAPABILITY")
    caps = (raw,) if isinstance(raw, str) else tuple(str(c) for c in raw) if isinstance(raw, tuple) else ()
    note = _literal(tree, "CAPABILITY_NOTE")
    return Declared(family, caps, note if isinstance(note, str) else "")
