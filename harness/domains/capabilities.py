"""The capabilities a qualification verdict is made of, one per claim family (read from the
families' packages: :mod:`harness.domains.families`).

Suites declare which capability their tests decide with a module-level
``pytestmark = pytest.mark.amp_capability("<name>")``; ``amp-harness qualify`` reads the
declaration back from the JUnit XML (a test property), never from paths or message text.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.domains import families

#: Every capability, from the families' declarations (``CAPABILITY`` in each family's package),
#: in the order of the families' folders: a new family's capability needs no edit here.
CAPABILITIES: tuple[str, ...] = tuple(
    dict.fromkeys(cap for family in families.names() for cap in families.declared(family).capabilities)
)

#: A test that uses one of these fixtures decides that capability without a marker (a user's own
#: project qualifies with its own checks); an ``amp_capability`` marker wins. First match counts.
FIXTURE_CAPABILITIES: tuple[tuple[str, str], ...] = (
    ("amp_training", "training parity"),
    ("amp_speedup", "speed"),
    ("amp_compile_backend", "compiled AMP"),
)


def capability_of_fixtures(fixturenames: Iterable[str]) -> str | None:
    """The capability a test decides through the amp-harness fixtures it uses, or None."""
    names = set(fixturenames)
    return next((cap for fixture, cap in FIXTURE_CAPABILITIES if fixture in names), None)
