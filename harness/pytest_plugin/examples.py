"""The same hypothesis examples whatever else the run imported.

Under a derandomized profile (``amp-ci``) a property run's worst case is a comparable row: the
dashboard and ``amp-harness diff`` trend it. Hypothesis (6.1xx) also draws, 5% of the time, from
constants it harvests from every *local* module loaded so far (the project's non-test modules:
harness modules, conftests), so the examples, and the worst case, changed with which suites ran
before: ``mm.error_over_budget bfloat16`` read 0.78 with the numerics file alone and 0.62 in
``pytest suites/autocast``. Inside :func:`independent_of_loaded_modules` that pool is empty, which
leaves the draws to the seed and hypothesis's own constants. The pool is hypothesis's internal
state: where it is not found (another hypothesis release), nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def _providers() -> Any:
    """hypothesis's provider module where it has the local-constants pool, or None."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a hypothesis without it
        return None
    needed = ("_get_local_constants", "CONSTANTS_CACHE", "Constants", "SortedSet", "float_to_int")
    return providers if all(hasattr(providers, name) for name in needed) else None


@contextlib.contextmanager
def independent_of_loaded_modules() -> Iterator[None]:
    """Inside: hypothesis draws no constants from loaded local modules (see the module docstring)."""
    providers = _providers()
    if providers is None:
        yield
        return
    empty = providers.Constants(
        integers=providers.SortedSet(),
        floats=providers.SortedSet(key=providers.float_to_int),
        bytes=providers.SortedSet(),
        strings=providers.SortedSet(),
    )
    harvest = providers._get_local_constants
    providers.CONSTANTS_CACHE.cache.clear()  # permitted constants cached from the harvested pool
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = harvest
        providers.CONSTANTS_CACHE.cache.clear()
