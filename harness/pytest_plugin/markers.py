"""The plugin's markers, and which tier a test belongs to from them and the machine:
``amp_thorough``, ``amp_quick``, ``amp_thorough_on(device types)``, ``amp_thorough_dtypes(...,
on=)`` and ``amp_thorough_where_emulated(dtypes)`` (thorough where the CPU's kernels emulate the
dtype). Kept apart from the hooks so that the entry module stays a list of hooks."""

from __future__ import annotations

import pytest

from harness.platform.hardware import detect_cpu, emulated
from harness.pytest_plugin.machine import TIMING_MARK

#: the device types a marker may single out (amp_thorough_on, amp_thorough_dtypes(on=...))
DEVICE_TYPES = ("cpu", "cuda")

MARKERS = (
    "amp_quick: part of the quick tier (runs in every tier)",
    "amp_thorough: heavy check, runs only with --amp-tier=thorough",
    "amp_thorough_dtypes(*names, on=None): the check's amp_dtype parameters with these names (bf16, fp16) are "
    "amp_thorough (the others stay in the default tier); on='cpu' limits that to one device type",
    "amp_thorough_on(*device_types): heavy on these device types (cpu, cuda) only: thorough there, default elsewhere",
    "amp_thorough_where_emulated(*names): heavy where these dtypes (bf16, fp16) have no native CPU kernels (AVX2-only "
    "kernel sets): thorough on such a CPU, default elsewhere and on CUDA",
    "amp_cuda: needs a CUDA device; skipped with the reason when none is present",
    "amp_suite(name): the suite name used for baselines and report rows (default: the directory under suites/)",
    "amp_capability(name): the qualification capability a suite file's tests decide (amp-harness qualify)",
    "amp_harness: an amp-harness test that uses no amp_ fixture or marker otherwise (its hypothesis profile applies)",
    "amp_timeout(seconds): this test's time limit instead of --amp-timeout / --amp-timeout-heavy (0: none)",
    f"{TIMING_MARK}: the test times something: under pytest-xdist no other worker runs a test beside it "
    "(a test that uses amp_speedup or amp_interconnect is one)",
)


def tier_of(item: pytest.Item) -> tuple[str, str | None]:
    """The item's tier (quick, default, thorough) and, where it is thorough because this CPU
    emulates a dtype it names, why."""
    tier = (
        "thorough"
        if item.get_closest_marker("amp_thorough") or _thorough_on_this_device(item)
        else "quick"
        if item.get_closest_marker("amp_quick")
        else "default"
    )
    why = _emulated_here(item) if tier != "thorough" else None
    return ("thorough" if why is not None else tier), why


def _emulated_here(item: pytest.Item) -> str | None:
    """For ``amp_thorough_where_emulated(*names)`` on a CPU check: why the first named dtype the
    kernels in force emulate is emulated (the item is thorough here); None where all run natively."""
    marker = item.get_closest_marker("amp_thorough_where_emulated")
    if marker is None or _device_type(item) not in (None, "cpu"):
        return None
    cpu = detect_cpu()
    try:
        return next((why for why in (emulated(str(n), cpu) for n in marker.args) if why is not None), None)
    except ValueError as error:
        raise pytest.UsageError(f"{item.nodeid}: amp_thorough_where_emulated: {error}") from None


def _device_type(item: pytest.Item) -> str | None:
    """The device type (cpu, cuda) of an item parametrized by ``amp_device``; None for another item."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return str(params["amp_device"]).split(":")[0] if "amp_device" in params else None


def _thorough_on_this_device(item: pytest.Item) -> bool:
    """``amp_thorough_on("cpu")``, or ``amp_thorough_dtypes(..., on="cpu")`` for this item's dtype:
    the item is thorough on its device type."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    device_type = _device_type(item)
    if device_type is None:
        return False
    whole = item.get_closest_marker("amp_thorough_on")
    if whole is not None:
        unknown = [a for a in whole.args if a not in DEVICE_TYPES]
        if unknown:
            raise pytest.UsageError(
                f"{item.nodeid}: amp_thorough_on({', '.join(map(repr, unknown))}): choose cpu or cuda"
            )
        if device_type in whole.args:
            return True
    marker = item.get_closest_marker("amp_thorough_dtypes")
    on = marker.kwargs.get("on") if marker is not None else None
    if marker is None or on is None or "amp_dtype" not in params:
        return False
    return str(params["amp_dtype"]) in marker.args and device_type == on
