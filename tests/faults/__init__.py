"""Deliberately wrong implementations, one module per claim family (``faults.<family>``, the name
of the family's package under ``harness/domains/``): each must make a named check of that family's
suite fail (the ``tests/test_*_can_fail.py`` files run the real suite files with them injected).
``faults.stacks`` is not a family's: it installs the families' harness-free faults by name, in an
injected conftest or a standalone script's interpreter. ``tests/test_architecture.py`` holds the
modules to the families.

Typed and checked by ``mypy --strict`` with the harness (``.ci/run``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NEGATIVE_CONTROL_PROFILE = "negative-control"


def fixed_in_this_release(registry: Mapping[str, Any], *issues: str) -> dict[str, Any]:
    """A copy of a family's ``KNOWN_ISSUES`` saying ``issues`` were fixed in the running torch
    release (first seen and verified in 2.0): on a release that still has them the checks judge
    them as they would without the entries, and the registry checks read them as regressions. The
    family's own registry is left as it is."""
    import dataclasses

    import torch

    from harness.platform.versions import minor

    fixed = minor(torch.__version__)
    return {
        **registry,
        **{i: dataclasses.replace(registry[i], first="2.0", verified="2.0", fixed=fixed) for i in issues},
    }


def register_negative_control_profile() -> None:
    """For runs that only need to show a check fails: the first counterexample, not the smallest.
    Hypothesis is imported here, not with the package: distributed ranks import ``faults``, and
    each would otherwise import hypothesis again (about 3 s per launch on 2 cores)."""
    from hypothesis import Phase, settings

    settings.register_profile(
        NEGATIVE_CONTROL_PROFILE,
        max_examples=40,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
