"""Every registered known issue, from each family's registry, with its standalone reproduction:
the one place that knows all the families' registries (``amp-harness repro --known``, the
dashboard's and the fleet's known-issue columns). Above the family packages; they never import it.

A family's registry is its ``known_issues`` module (``KNOWN_ISSUES`` and ``REPRODUCTIONS``),
found by looking in every family's folder: a new family's registry needs no edit here.
"""

from __future__ import annotations

import importlib

from harness.domains import families
from harness.domains.repro import Reproduction, known_issue_script
from harness.domains.versions import KnownIssue

#: the families that keep a registry, in the order of their folders
WITH_REGISTRY: tuple[str, ...] = tuple(f for f in families.names() if (families.HERE / f / "known_issues.py").exists())

REGISTRIES: dict[str, tuple[str, KnownIssue]] = {}
REPRODUCTIONS: dict[str, Reproduction] = {}
for _family in WITH_REGISTRY:
    _registry = importlib.import_module(f"harness.domains.{_family}.known_issues")
    REGISTRIES.update({k: (f"harness/domains/{_family}/known_issues.py", v) for k, v in _registry.KNOWN_ISSUES.items()})
    REPRODUCTIONS.update(_registry.REPRODUCTIONS)


def script(issue_id: str, provenance: str, body: str | None = None) -> str:
    """The standalone script of ``issue_id``: a header naming the issue, its registry entry and
    ``provenance`` (versions, hardware, date: where the script was written), then its body."""
    try:
        reproduction = REPRODUCTIONS[issue_id]
    except KeyError:
        raise KeyError(f"no reproduction for {issue_id!r}; known issues: {', '.join(sorted(REPRODUCTIONS))}") from None
    where, issue = REGISTRIES[issue_id]
    return known_issue_script(issue, where, reproduction, provenance, body)
