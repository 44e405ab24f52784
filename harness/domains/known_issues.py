"""Every registered known issue, from each family's registry, with its standalone reproduction:
the one place that knows all the families' registries (``amp-harness repro --known``, the
dashboard's and the fleet's known-issue columns). Above the family packages; they never import it."""

from __future__ import annotations

from harness.domains.block_scaled import known_issues as block_scaled
from harness.domains.compiled import known_issues as compiled
from harness.domains.fp8 import known_issues as fp8
from harness.domains.repro import Reproduction, known_issue_script
from harness.domains.scaler import known_issues as scaling
from harness.domains.versions import KnownIssue

#: Every registered known issue, by id, and the registry it is in.
REGISTRIES: dict[str, tuple[str, KnownIssue]] = {
    **{k: ("harness/domains/scaler/known_issues.py", v) for k, v in scaling.KNOWN_ISSUES.items()},
    **{k: ("harness/domains/compiled/known_issues.py", v) for k, v in compiled.KNOWN_ISSUES.items()},
    **{k: ("harness/domains/fp8/known_issues.py", v) for k, v in fp8.KNOWN_ISSUES.items()},
    **{k: ("harness/domains/block_scaled/known_issues.py", v) for k, v in block_scaled.KNOWN_ISSUES.items()},
}

#: The reproduction of every registered known issue, by id.
REPRODUCTIONS: dict[str, Reproduction] = {
    **scaling.REPRODUCTIONS,
    **compiled.REPRODUCTIONS,
    **fp8.REPRODUCTIONS,
    **block_scaled.REPRODUCTIONS,
}


def script(issue_id: str, provenance: str, body: str | None = None) -> str:
    """The standalone script of ``issue_id``: a header naming the issue, its registry entry and
    ``provenance`` (versions, hardware, date: where the script was written), then its body."""
    try:
        reproduction = REPRODUCTIONS[issue_id]
    except KeyError:
        raise KeyError(f"no reproduction for {issue_id!r}; known issues: {', '.join(sorted(REPRODUCTIONS))}") from None
    where, issue = REGISTRIES[issue_id]
    return known_issue_script(issue, where, reproduction, provenance, body)
