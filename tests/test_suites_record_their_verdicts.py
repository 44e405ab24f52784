"""Every claim in suites/ is a recorded verdict: a bare ``assert`` that decides a claim leaves no
report row (no measured value, allowance or origin) when it fails, so the suites may assert only

* to narrow a type (``assert x is not None``, ``assert isinstance(x, T)``),
* inside a property run (``with amp_record.property_run(...)``: its row records the failure),
* on verdicts already recorded, said so on the line (``# verdict recorded``).

Everything else goes through ``amp_record.require(compare_claim(...))`` (or ``require_run`` for a
state machine, whose exceptions become FAIL rows)."""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

MARK = "# verdict recorded"


def _narrows_a_type(test: ast.expr) -> bool:
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot):
        return isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return all(_narrows_a_type(v) for v in test.values)
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "isinstance"


def _in_property_run(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                is_call = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                if is_call and call.func.attr == "property_run":  # type: ignore[attr-defined]
                    return True
    return False


def bare_claims(source: str, name: str) -> list[str]:
    """``name:line: the assert`` for every assert in ``source`` that decides a claim unrecorded."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert):
            continue
        text = "\n".join(lines[node.lineno - 1 : (node.end_lineno or node.lineno)])
        if _narrows_a_type(node.test) or _in_property_run(node, parents) or MARK in text:
            continue
        out.append(f"{name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return out


def test_no_claim_in_the_suites_is_decided_by_a_bare_assert():
    found = [
        claim
        for path in sorted((REPO / "suites").rglob("*.py"))
        for claim in bare_claims(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert not found, (
        "a bare assert decides a claim without a report row; record it with "
        "amp_record.require(compare_claim(...)) (amp_record.require_run for a state machine), or mark an "
        f"assert on verdicts already recorded with {MARK!r}:\n" + "\n".join(found)
    )


def test_the_check_refuses_a_bare_claim_and_accepts_the_three_allowed_forms(tmp_path: Path):
    refused = "def test_x(amp_record):\n    assert 1 + 1 == 3, 'arithmetic'\n"
    assert bare_claims(refused, "suite.py") == ["suite.py:2: assert 1 + 1 == 3, 'arithmetic'"]
    allowed = (
        "def test_x(amp_record, y):\n"
        "    assert y is not None\n"
        "    assert isinstance(y, int) and y is not None\n"
        "    with amp_record.property_run('m', 'c') as tally:\n"
        "        def prop():\n"
        "            assert y > 0\n"
        "    missed = []\n"
        f"    assert not missed  {MARK}\n"
    )
    assert bare_claims(allowed, "suite.py") == []
