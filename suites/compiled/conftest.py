"""Fixtures of the compiled-AMP suite: one session-wide set of block observations per device and
backend (compiling is this suite's cost: each dtype and variant is compiled once and shared)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from harness.domains.compiled import heads, nested, runs, scalars
from harness.domains.compiled.known_issues import known_build_failure
from harness.domains.engines.bench import bench
from harness.domains.engines.compiler import toolchain
from harness.numerics.verdict import Outcome


def require_compiler(device: torch.device, backend: Any) -> None:
    """Skip, saying what is missing, where Inductor cannot compile for ``device`` here."""
    if backend == "inductor":
        reason = toolchain.unavailable(device.type)
        if reason is not None:
            pytest.skip(f"no working compiler toolchain: {reason}")


def pytest_collection_finish(session: pytest.Session) -> None:
    """When this run selected compiled checks, Inductor's one-time ISA probe starts now, beside
    the checks that run before them (:func:`harness.domains.engines.compiler.toolchain.warm_up_in_background`)."""
    here = Path(__file__).parent
    if any(here in Path(str(item.path)).parents for item in session.items):
        toolchain.warm_up_in_background()


@pytest.fixture(scope="session")
def _shared_runs() -> dict[tuple[str, str, int], Any]:
    """Observations made once per session: (kind, device, backend) -> the runs object."""
    return {}


def _shared(cache: dict[tuple[str, str, int], Any], factory: Any, device: torch.device, backend: Any) -> Any:
    require_compiler(device, backend)
    key = (factory.__qualname__, str(device), id(backend))
    if key not in cache:
        cache[key] = factory(device, backend)
    return cache[key]


class _KnownBuildFailure:
    """The probe block's runs, where a compile that fails with a registered build failure of this
    release (``inductor-cpu-vectorizedn-fmadd-build-failure``) records KNOWN and skips, naming it;
    any other failure is raised."""

    def __init__(self, wrapped: runs.BlockRuns, record: Any, device: torch.device) -> None:
        self._wrapped, self._record, self._device = wrapped, record, device

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def compiled(self, dtype: torch.dtype | None, variant: runs.Variant = runs.DEFAULT) -> runs.Compiled:
        try:
            return self._wrapped.compiled(dtype, variant)
        except Exception as exc:
            issue = known_build_failure(exc, self._device.type)
            if issue is None:
                raise
            self._record(
                f"compiled.{variant.name}.builds", True, outcome=Outcome.KNOWN, device=self._device, dtype=dtype
            )
            pytest.skip(f"KNOWN on torch {torch.__version__}: {issue.id} ({issue.reference})")


@pytest.fixture
def raw_block_runs(amp_device, amp_compile_backend, _shared_runs) -> runs.BlockRuns:
    """The probe block's observations as they are (a build failure raises): the registry check's."""
    return _shared(_shared_runs, runs.BlockRuns, amp_device, amp_compile_backend)


@pytest.fixture
def block_runs(raw_block_runs, amp_device, amp_record) -> runs.BlockRuns:
    """The probe block's observations on the device under test with the backend under test."""
    return _KnownBuildFailure(raw_block_runs, amp_record, amp_device)  # type: ignore[return-value]


@pytest.fixture
def region_runs(amp_device, amp_compile_backend, _shared_runs) -> nested.RegionRuns:
    """The autocast-disabled region's runs on the device under test with the backend under test."""
    return _shared(_shared_runs, nested.RegionRuns, amp_device, amp_compile_backend)


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


@pytest.fixture(autouse=True)
def _timing_threads(amp_device, amp_fingerprint):
    """Every compiled-suite test runs on the speed measurement's CPU thread count. Dynamo guards on
    the thread count and Inductor generates different C++ for one thread (no OpenMP), so a block
    compiled on two threads is compiled again when timed on one: on two cores, two more cold
    compiles (about 12 s) for nothing. The run's fingerprint is taken first: a CPU's hardware class
    counts the threads torch uses in the process, not the timing's."""
    with bench.timing_threads(amp_device):
        yield


@pytest.fixture
def scalar_runs(amp_device, amp_compile_backend, _shared_runs) -> scalars.ScalarRuns:
    """The scalar cases' program, eager and compiled with the backend under test (one compile per dtype)."""
    return _shared(_shared_runs, scalars.ScalarRuns, amp_device, amp_compile_backend)


@pytest.fixture
def heads_runs(amp_device, amp_compile_backend, _shared_runs) -> heads.HeadsRuns:
    """The program whose logits feed several losses, eager, float64 and compiled with the backend
    under test (one compile per dtype; each head alone only where that fails)."""
    return _shared(_shared_runs, heads.HeadsRuns, amp_device, amp_compile_backend)
