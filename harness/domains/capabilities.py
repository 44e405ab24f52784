"""The capabilities a qualification verdict is made of, one per claim family.

Suites declare which capability their tests decide with a module-level
``pytestmark = pytest.mark.amp_capability("<name>")``; ``amp-harness qualify`` reads the
declaration back from the JUnit XML (a test property), never from paths or message text.
"""

from __future__ import annotations

CAPABILITIES: tuple[str, ...] = (
    "formats",
    "autocast policy",
    "numerics",
    "loss scaling",
    "training parity",
    "speed",
    "memory",
    "distributed",
    "compiled AMP",
)
