"""The fixtures suites use. Registered through the ``pytest11`` entry point ``amp_harness_fixtures``.

Each fixture builds a narrow collaborator from the session (a recorder with a row sink, a
baseline context, a profile) and imports torch lazily, so an installed plugin costs nothing in
runs that use none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from harness.platform.hardware import Fingerprint
from harness.pytest_plugin.collaborators import BaselineContext, Baselines
from harness.pytest_plugin.options import DTYPE_NAMES
from harness.pytest_plugin.recording import CAPABILITY_PROPERTY, NOTE_PROPERTY, OUTCOME_PROPERTY, Recorder, TestIdentity
from harness.pytest_plugin.state import State, state_of, suite_of
from harness.storage import baselines as bl
from harness.storage.provenance import provenance

#: ``amp_speedup``'s callback: ``(workload, dtype_name, calibrate_flags="") -> None``.
SpeedCheck = Callable[..., None]

if TYPE_CHECKING:
    import torch

    from harness.domains.engines.bench.workload import Workload
    from harness.domains.training.check import TrainingChecks
    from harness.storage.profiles import Profile

__all__ = [
    "CAPABILITY_PROPERTY",
    "amp_baseline",
    "amp_calibrate_command",
    "amp_compile_backend",
    "amp_device",
    "amp_dtype",
    "amp_fingerprint",
    "amp_hardware_class",
    "amp_interconnect",
    "amp_profile",
    "amp_record",
    "amp_require_speedup",
    "amp_speedup",
    "amp_torchao",
    "amp_training",
]


def _active(request: pytest.FixtureRequest) -> State:
    st = state_of(request.config)
    st.activated = True
    return st


@pytest.fixture
def amp_device(request: pytest.FixtureRequest) -> torch.device:
    """The device under test, parametrized by ``--amp-device`` (CPU, plus ``cuda:N`` when present).

    Example::

        def test_matmul(amp_device):
            a = torch.randn(4, 4, device=amp_device)
    """
    import torch

    _active(request)
    return torch.device(str(request.param))


@pytest.fixture
def amp_dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """The autocast dtype under test, parametrized by ``--amp-dtypes``; bf16 on a GPU without it
    is skipped with the reason.

    Example::

        def test_linear(amp_device, amp_dtype):
            with torch.autocast(amp_device.type, dtype=amp_dtype): ...
    """
    import torch

    _active(request)
    dtype = getattr(torch, DTYPE_NAMES[str(request.param)])
    assert isinstance(dtype, torch.dtype)
    if dtype is torch.bfloat16 and "amp_device" in request.fixturenames:
        device = request.getfixturevalue("amp_device")
        if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            name = torch.cuda.get_device_name(device)
            pytest.skip(f"bf16 is missing: {name} has no native bfloat16 support (compute capability < 8.0)")
    return dtype


@pytest.fixture
def amp_fingerprint(request: pytest.FixtureRequest) -> Fingerprint:
    """What hardware detection saw (CPU, GPUs, torch/CUDA versions).

    Example::

        def test_stack(amp_fingerprint):
            print(amp_fingerprint.torch_minor, amp_fingerprint.cpu_profile)
    """
    return _active(request).fingerprint


@pytest.fixture(scope="session")
def amp_torchao() -> ModuleType:
    """torchao, or a skip that names what is missing (install: ``pip install amp-harness[fp8]``):
    the fp8, block-scaled and stochastic-rounding suites judge torchao's code by default.

    Example::

        def test_my_fp8_recipe(amp_torchao):
            config = amp_torchao.float8.Float8LinearConfig.from_recipe_name("rowwise")
    """
    from harness.platform import thirdparty  # lazy: imports torch

    missing = thirdparty.torchao_missing()
    if missing is not None:
        pytest.skip(missing)
    module: ModuleType = thirdparty.import_third_party("torchao")
    return module


@pytest.fixture
def amp_profile(request: pytest.FixtureRequest) -> str:
    """The hardware profile id of the run's primary device (keys per-profile baselines).

    Example::

        def test_curves(amp_profile):
            assert amp_profile.startswith(("cpu-", "nvidia-", "generic"))
    """
    st = _active(request)
    return st.profile_for(st.primary_device)


@pytest.fixture
def amp_record(request: pytest.FixtureRequest) -> Recorder:
    """Record measurements as rows of the run report, and decide verdicts once.

    Example::

        def test_bound(amp_record):
            amp_record("worst_error", 1e-4, unit="relative")                       # information
            amp_record.require(compare_bound("err", 1e-4, 2**-8, "u of bf16"))       # row + assertion
    """
    st = _active(request)
    item = request.node

    def label(outcome: str, note: str) -> None:
        item.user_properties.append((OUTCOME_PROPERTY, outcome))
        if note:
            item.user_properties.append((NOTE_PROPERTY, note))

    who = TestIdentity(item.nodeid, suite_of(item), getattr(item, "originalname", item.name))
    return Recorder(who, st.run_id, st.add_row, st.profile_for, label, st.attach)


@pytest.fixture
def amp_compile_backend(request: pytest.FixtureRequest) -> Any:
    """The ``torch.compile`` backend the compiled-AMP suite judges against eager: ``"inductor"``.
    Override it in a ``conftest.py`` to judge another backend (a name or a backend callable); the
    harness's own tests hand it faulty backends to show the checks fail.

    Example::

        @pytest.fixture
        def amp_compile_backend():
            return my_backend  # (gm, example_inputs) -> callable, as torch.compile takes
    """
    _active(request)
    return "inductor"


@pytest.fixture
def amp_hardware_class(request: pytest.FixtureRequest) -> Profile:
    """The device under test's *hardware class* as calibrated here: its
    :class:`harness.storage.profiles.Profile` (calibrated speed thresholds, published peaks). Not to
    be confused with the *kernel profile* (``amp_profile``, ``--amp-profile``: the ISA-level id that
    keys golden curves) or a hypothesis profile.

    Example::

        def test_speed(amp_hardware_class):
            th = amp_hardware_class.threshold("matmul_1024", "bfloat16")
    """
    from harness.storage import profiles  # lazy: imports torch

    st = _active(request)
    device = str(request.getfixturevalue("amp_device")) if "amp_device" in request.fixturenames else st.primary_device
    try:
        return profiles.load(st.options.baseline_dir, st.fingerprint.class_for(device).id, st.profile_for(device))
    except profiles.ProfileFileError as exc:
        pytest.fail(str(exc), pytrace=False)


@dataclass(frozen=True)
class Interconnect:
    """What a bandwidth check needs of the run: the profile of the hardware class whose interconnect
    a backend's collectives cross (``load("gloo")``: the CPU's; ``load("nccl")``: the first GPU's),
    and the command that calibrates its all-reduce floors where this run reads its baselines."""

    load: Callable[[str], Profile]
    calibrate_command: str


@pytest.fixture
def amp_interconnect(request: pytest.FixtureRequest) -> Interconnect:
    """The interconnect's hardware-class profile and calibration command (:class:`Interconnect`).

    Example::

        def test_bandwidth(amp_interconnect):
            floor = amp_interconnect.load("gloo").threshold(case, "float32")
    """
    import shlex

    from harness.storage import profiles  # lazy: imports torch

    st = _active(request)

    def load(backend: str) -> Profile:
        device = "cuda:0" if backend == "nccl" else "cpu"
        try:
            return profiles.load(st.options.baseline_dir, st.fingerprint.class_for(device).id, st.profile_for(device))
        except profiles.ProfileFileError as exc:
            pytest.fail(str(exc), pytrace=False)

    return Interconnect(
        load, f"amp-harness calibrate --allreduce --baseline-dir {shlex.quote(str(st.options.baseline_dir))}"
    )


@pytest.fixture
def amp_require_speedup(request: pytest.FixtureRequest) -> bool:
    """Whether the run's qualification policy requires AMP to pay off (``--amp-require-speedup``).

    Example::

        def test_speed(amp_require_speedup):
            if amp_require_speedup: ...   # judge speedup >= 1 as well
    """
    return _active(request).options.require_speedup


@pytest.fixture
def amp_calibrate_command(request: pytest.FixtureRequest) -> str:
    """The command that calibrates the speed thresholds of the device under test's hardware class,
    writing them where this run reads its baselines.

    Example::

        def test_speed(amp_calibrate_command):
            print(f"not judged: run {amp_calibrate_command}")
    """
    import shlex

    st = _active(request)
    device = str(request.getfixturevalue("amp_device")) if "amp_device" in request.fixturenames else st.primary_device
    return f"amp-harness calibrate --device {device} --baseline-dir {shlex.quote(str(st.options.baseline_dir))}"


@pytest.fixture
def _amp_slowdown() -> float:
    """Factor by which ``amp_speedup`` slows the AMP path: 1.0, as it is. The harness's own tests
    override it (1.3, the slowdown the speed gate must catch) to show a speed check can fail.

    Example::

        @pytest.fixture
        def _amp_slowdown():  # in a conftest.py: every speed check of the directory slowed 1.3x
            return 1.3
    """
    return 1.0


@pytest.fixture
def _amp_speed_rounds() -> int | None:
    """Rounds per speed measurement: None, adaptive (:class:`harness.domains.engines.bench.bench.Rounds`).
    The harness's own tests of the speed checks' mechanics (rows, pytest-benchmark results, the
    NOT JUDGED path) fix it at ``bench.MIN_ROUNDS``: they judge nothing, so precision buys nothing.

    Example::

        @pytest.fixture
        def _amp_speed_rounds():  # in a conftest.py: 6 rounds, whatever the interval
            return 6
    """
    return None


@pytest.fixture
def amp_speedup(
    request: pytest.FixtureRequest,
    amp_device: torch.device,
    amp_hardware_class: Profile,
    amp_record: Recorder,
    amp_calibrate_command: str,
    amp_require_speedup: bool,
    _amp_slowdown: float,
    _amp_speed_rounds: int | None,
    benchmark: Any,
) -> SpeedCheck:
    """``amp_speedup(workload, dtype_name, calibrate_flags="")``: measure a speed workload's AMP path
    against its baseline, interleaved, and judge it against the device's calibrated hardware class
    (:func:`harness.pytest_plugin.speed.check_speedup`: rows, a confirmed FAIL, NOISY, NOT JUDGED).
    The AMP path is slowed by ``_amp_slowdown``'s factor (1.0; the harness's negative controls
    override it); pytest-benchmark's ``benchmark`` fixture times the AMP blocks.

    Example::

        def test_my_speed(amp_speedup):
            amp_speedup(Workload("mm", make_mm, flops=2 * 1024**3), "bfloat16")
    """
    from harness.pytest_plugin.speed import check_speedup  # lazy: imports torch

    def check(workload: Workload, dtype_name: str, calibrate_flags: str = "") -> None:
        __tracebackhide__ = True
        check_speedup(
            workload,
            dtype_name,
            device=amp_device,
            profile=amp_hardware_class,
            record=amp_record,
            slowdown=_amp_slowdown,
            rounds=_amp_speed_rounds,
            calibrate_command=f"{amp_calibrate_command} {calibrate_flags}".strip(),
            benchmark=benchmark,
            require_speedup=amp_require_speedup,
        )

    return check


@pytest.fixture
def amp_training(amp_record: Recorder, request: pytest.FixtureRequest) -> TrainingChecks:
    """Parity, the AMP lane (with the explainer's broken recipes as positive controls),
    determinism and census checks for a model of yours, on the test's ``amp_device`` where it has
    one, else on the run's primary device (``--amp-device``: a GPU when there is one);
    ``amp_training.on("cuda:1")`` names a device explicitly.

    Example::

        from harness.api import BF16, FP16_SCALER, Setup

        def test_my_model(amp_training):
            amp_training.check(Setup("mine", model, batch, loss, steps=20, lr=1e-3), [BF16, FP16_SCALER])

        def test_my_step(amp_training):  # your own step: build(seed) -> objects, step(objects, batch, precision)
            amp_training.check_step(build, step, [BF16, FP16_SCALER], batches=batches)
    """
    import torch  # lazy: the plugin loads in every pytest run, and imports torch only when a test uses it

    from harness.domains.training.check import TrainingChecks  # lazy: it imports torch

    if "amp_device" in request.fixturenames:
        return TrainingChecks(amp_record, request.getfixturevalue("amp_device"))
    return TrainingChecks(amp_record, torch.device(_active(request).primary_device))


@pytest.fixture
def amp_baseline(request: pytest.FixtureRequest, amp_record: Recorder) -> Baselines:
    """Golden baselines with the pytest-regressions lifecycle (see ``--amp-regen``, ``--amp-accept-all``).

    Example::

        def test_table(amp_baseline):
            amp_baseline.check("limits", table, key=KeyKind.UNIVERSAL)
    """

    st = _active(request)
    regen: list[str] = []
    if st.options.profile:
        regen.append(f"--amp-profile={st.options.profile}")
    if st.options.baseline_dir != st.rootdir / "baselines":
        import shlex

        regen.append(f"--amp-baseline-dir={shlex.quote(str(st.options.baseline_dir))}")
    if st.options.candidates_dir is not None:
        import shlex

        regen.append(f"--amp-candidates-dir={shlex.quote(str(st.options.candidates_dir))}")

    def key_for(kind: bl.KeyKind, device: str) -> str:
        return bl.key_for(kind, st.profile_for(device), st.fingerprint.torch_minor)

    def provenance_for(device: str) -> dict[str, object]:
        return provenance(st.fingerprint, device=device, profile=st.profile_for(device), commit=st.commit)

    ctx = BaselineContext(st.store, st.options.mode, key_for, provenance_for, st.primary_device, tuple(regen))
    return Baselines(ctx, request.node.nodeid, amp_record)
