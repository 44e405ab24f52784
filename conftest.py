"""Root conftest: the amp-harness plugin itself is registered by the ``pytest11`` entry point.

This file makes a missing installation explain itself instead of failing obscurely, and tunes
Python's cyclic garbage collector for runs of this repository (a property of these runs, not of
the plugin, which leaves a user's process as it finds it).
"""

import gc

import pytest

#: Allocations between young-generation collections (CPython's default: 700). A run of this
#: repository holds torch, hypothesis and pandas, and its checks allocate many short-lived objects:
#: at the default the collector ran thousands of times, mostly rescanning objects that live for the
#: whole run (the measured share of a `pytest`: docs/running.md).
YOUNG_GENERATION = 7000
# set on import: pytest imports this file before the conftests below it, which import torch
gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("amp_harness"):
        raise pytest.UsageError(
            "the amp-harness pytest plugin is not loaded: install the project first, "
            "`pip install -c constraints/cpu.txt -e '.[dev]'` (CPU) or `pip install -e '.[dev]'` (GPU host)"
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the run has imported and collected lives until it ends: collected once, then frozen,
    the collector no longer rescans it at every full collection."""
    gc.collect()
    gc.freeze()
