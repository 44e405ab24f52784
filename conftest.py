"""Root conftest: the amp-harness plugin itself is registered by the ``pytest11`` entry point.

This file only makes a missing installation explain itself instead of failing obscurely.
"""

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("amp_harness"):
        raise pytest.UsageError(
            "the amp-harness pytest plugin is not loaded: install the project first, "
            "`pip install -c constraints/cpu.txt -e '.[dev]'` (CPU) or `pip install -e '.[dev]'` (GPU host)"
        )
