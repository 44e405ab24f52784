"""Fixtures of the compiled-AMP suite: one session-wide set of block observations per device and
backend (compiling is this suite's cost: each dtype and variant is compiled once and shared)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.domains.compiled import nested, runs, toolchain
from harness.domains.speed import bench


def require_compiler(device: torch.device, backend: Any) -> None:
    """Skip, saying what is missing, where Inductor cannot compile for ``device`` here."""
    if backend == "inductor":
        reason = toolchain.unavailable(device.type)
        if reason is not None:
            pytest.skip(f"no working compiler toolchain: {reason}")


@pytest.fixture(scope="session")
def _block_runs_cache() -> dict[tuple[str, int], runs.BlockRuns]:
    return {}


@pytest.fixture
def block_runs(amp_device, amp_compile_backend, _block_runs_cache) -> runs.BlockRuns:
    """The probe block's observations on the device under test with the backend under test."""
    require_compiler(amp_device, amp_compile_backend)
    key = (str(amp_device), id(amp_compile_backend))
    if key not in _block_runs_cache:
        _block_runs_cache[key] = runs.BlockRuns(amp_device, amp_compile_backend)
    return _block_runs_cache[key]


@pytest.fixture
def compiler(amp_device, amp_compile_backend):
    """``compiler(fn)``: ``torch.compile(fn)`` with the backend under test (Dynamo reset first)."""
    require_compiler(amp_device, amp_compile_backend)
    return lambda fn: runs.compile_fn(fn, amp_compile_backend)


@pytest.fixture
def inductor_only(amp_compile_backend) -> None:
    """Skip checks of Inductor's own switches when the backend under test is another one."""
    if amp_compile_backend != "inductor":
        pytest.skip(f"an Inductor configuration switch: the backend under test is {amp_compile_backend!r}")


@pytest.fixture(scope="session")
def _region_runs_cache() -> dict[tuple[str, int], nested.RegionRuns]:
    return {}


@pytest.fixture
def region_runs(amp_device, amp_compile_backend, _region_runs_cache) -> nested.RegionRuns:
    """The autocast-disabled region's runs on the device under test with the backend under test."""
    require_compiler(amp_device, amp_compile_backend)
    key = (str(amp_device), id(amp_compile_backend))
    if key not in _region_runs_cache:
        _region_runs_cache[key] = nested.RegionRuns(amp_device, amp_compile_backend)
    return _region_runs_cache[key]


@pytest.fixture
def amp_slowdown() -> float:
    """Factor by which the compiled AMP path is slowed (1.0: as it is; the harness's tests inject 1.3)."""
    return 1.0


@pytest.fixture(autouse=True)
def _timing_threads(amp_device, amp_fingerprint):
    """Every compiled-suite test runs on the speed measurement's CPU thread count. Dynamo guards on
    the thread count and Inductor generates different C++ for one thread (no OpenMP), so a block
    compiled on two threads is compiled again when timed on one: on two cores, two more cold
    compiles (about 12 s) for nothing. The run's fingerprint is taken first: a CPU's hardware class
    counts the threads torch uses in the process, not the timing's."""
    if amp_device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(bench.CPU_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
