"""Which tests are amp-harness's, and the hypothesis profile they run under. Nothing of the plugin
(tiers, CUDA skips, hypothesis profiles) touches any other test."""

from __future__ import annotations

import pytest

from harness.pytest_plugin.options import explicit_hypothesis_profile, register_hypothesis_profiles
from harness.pytest_plugin.state import state_of


def is_ours(item: pytest.Item) -> bool:
    """An amp-harness test: it carries an ``amp_*`` marker or uses an ``amp_*`` fixture. Nothing
    of this plugin (tiers, CUDA skips, hypothesis profiles) touches any other test."""
    if any(m.name.startswith("amp_") for m in item.iter_markers()):
        return True
    return any(name.startswith("amp_") for name in getattr(item, "fixturenames", ()))


def hypothesis_profile_of_ours(config: pytest.Config) -> str | None:
    """The profile amp-harness tests run under; None when ``--hypothesis-profile`` names one (it wins)."""
    if explicit_hypothesis_profile(config):
        return None
    return state_of(config).options.hypothesis_profile


def apply_profile_to_given(item: pytest.Item, profile: str) -> None:
    """A ``@given`` test took hypothesis' default settings when its module was imported; an
    amp-harness test without settings of its own gets the harness profile instead (a test that is
    not ``@given`` leaves hypothesis unimported)."""
    fn = getattr(item, "obj", None)
    inner = getattr(fn, "hypothesis", None)
    if fn is None or inner is None or getattr(fn, "_hypothesis_internal_settings_applied", False):
        return
    from hypothesis import settings

    register_hypothesis_profiles()
    settings(settings.get_profile(profile))(fn)
