"""The pytest plugin: options, markers, fixtures and session hooks (thin glue only).

Registered once, through the ``pytest11`` entry point ``amp_harness``. torch is imported lazily
so that an installed harness costs nothing in unrelated pytest runs. All state lives on
``config.stash[STATE]``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness import __version__
from harness.numerics.comparison import (
    AnyComparison,
    BoundComparison,
    DataComparison,
    ElementwiseComparison,
    ScalarComparison,
    explain,
)
from harness.numerics.tolerance import EXACT, Tolerance
from harness.storage import baselines as bl
from harness.storage import report as rp
from harness.storage.hardware import Fingerprint, ProfileError, detect, validate_profile
from harness.storage.provenance import git_commit, provenance

if TYPE_CHECKING:
    import torch

TIERS = ("quick", "default", "thorough")
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_WORKER_KEY = "amp_harness"

#: hypothesis settings profiles: (max_examples, derandomize). ``ci`` is reproducible run to run.
HYPOTHESIS_PROFILES: dict[str, dict[str, Any]] = {
    "ci": {"max_examples": 40, "derandomize": True, "database": None},
    "dev": {"max_examples": 100},
    "thorough": {"max_examples": 1000},
}


@dataclass(frozen=True)
class Options:
    devices: str
    dtypes: tuple[str, ...]
    profile: str | None
    tier: str
    baseline_dir: Path
    mode: bl.Mode
    report_dir: Path | None


@dataclass
class State:
    """Per-session plugin state (on ``config.stash``)."""

    options: Options
    rootdir: Path
    run_id: str
    started: str
    store: bl.BaselineStore
    is_worker: bool
    rows: list[dict[str, Any]] = field(default_factory=list)
    activated: bool = False
    deselected: int = 0
    test_outcomes: dict[str, int] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    report_path: Path | None = None
    worker_id: str | None = None
    _fingerprint: Fingerprint | None = None
    _commit: str | None = None
    _commit_read: bool = False

    @property
    def fingerprint(self) -> Fingerprint:
        if self._fingerprint is None:
            self._fingerprint = detect()
        return self._fingerprint

    @property
    def commit(self) -> str | None:
        if not self._commit_read:
            self._commit, self._commit_read = git_commit(self.rootdir), True
        return self._commit

    def profile_for(self, device: str) -> str:
        """The hardware profile of a device; ``--amp-profile`` overrides the run's primary device."""
        fp = self.fingerprint
        is_cuda = device.startswith("cuda")
        detected = (fp.cuda_profile or "generic") if is_cuda else fp.cpu_profile
        primary_is_cuda = bool(fp.gpus) and self.options.devices != "cpu"
        if self.options.profile and is_cuda == primary_is_cuda:
            return self.options.profile
        return detected

    @property
    def primary_device(self) -> str:
        d = self.options.devices
        if d in ("auto", "cuda") and self.fingerprint.gpus:
            return f"cuda:{gpu_for_worker(self.worker_id, len(self.fingerprint.gpus))}"
        return "cpu" if d == "auto" else d


STATE = pytest.StashKey[State]()


def state_of(config: pytest.Config) -> State:
    return config.stash[STATE]


# -- options ----------------------------------------------------------------------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("amp-harness", "amp-harness: mixed-precision regression checks")
    g.addoption(
        "--amp-device",
        default="auto",
        help="devices the device-parametrized checks run on: auto (CPU, plus cuda:0 when CUDA is present), "
        "cpu, cuda or cuda:N. Naming CUDA on a machine without it is an error. Default: auto.",
    )
    g.addoption(
        "--amp-dtypes",
        default="bf16,fp16",
        help="comma-separated autocast dtypes the dtype-parametrized checks cover (bf16, fp16). Default: bf16,fp16.",
    )
    g.addoption(
        "--amp-profile",
        default=None,
        help="hardware profile id that keys thresholds and per-profile baselines (e.g. cpu-avx512bf16, "
        "nvidia-h200). Default: detected from the machine; an unknown id is an error listing the known ones.",
    )
    g.addoption(
        "--amp-tier",
        default="default",
        choices=TIERS,
        help="quick: only tests marked quick; default: all but those marked thorough; thorough: everything, "
        "with the thorough hypothesis profile. Tests outside the tier are skipped with the option that runs them.",
    )
    g.addoption(
        "--amp-baseline-dir",
        default=None,
        help="root of the golden baselines (default: <rootdir>/baselines).",
    )
    g.addoption(
        "--amp-regen",
        action="store_true",
        help="rewrite missing, mismatching or unreadable baselines from this run; those tests still FAIL so the "
        "diff gets reviewed.",
    )
    g.addoption(
        "--amp-accept-all",
        action="store_true",
        help="rewrite missing, mismatching or unreadable baselines from this run and let those tests PASS.",
    )
    g.addoption(
        "--amp-report-dir",
        default=None,
        help="where the run report (parquet + CSV + run.json) goes, one sub-directory per run "
        "(default: <rootdir>/amp-reports).",
    )
    g.addoption("--amp-no-report", action="store_true", help="do not write a run report.")


def _parse_options(config: pytest.Config) -> Options:
    rootdir = Path(config.rootpath)
    devices = str(config.getoption("--amp-device")).strip()
    if not _DEVICE_RE.match(devices):
        raise pytest.UsageError(f"--amp-device={devices!r}: expected auto, cpu, cuda or cuda:N (N a GPU index)")
    raw = [d.strip() for d in str(config.getoption("--amp-dtypes")).split(",") if d.strip()]
    unknown = [d for d in raw if d not in DTYPE_NAMES]
    if not raw or unknown:
        raise pytest.UsageError(
            f"--amp-dtypes={config.getoption('--amp-dtypes')!r}: unknown {', '.join(unknown) or '(empty)'}; "
            f"choose from {', '.join(DTYPE_NAMES)}"
        )
    profile = config.getoption("--amp-profile")
    bdir_opt = config.getoption("--amp-baseline-dir")
    baseline_dir = Path(bdir_opt) if bdir_opt else rootdir / "baselines"
    if profile is not None:
        from harness.storage.profiles import known

        try:
            profile = validate_profile(str(profile), known(baseline_dir))
        except ProfileError as exc:
            raise pytest.UsageError(f"--amp-profile: {exc}") from None
    regen, accept = bool(config.getoption("--amp-regen")), bool(config.getoption("--amp-accept-all"))
    if regen and accept:
        raise pytest.UsageError(
            "--amp-regen (rewrite and fail) and --amp-accept-all (rewrite and pass) exclude each other"
        )
    mode = bl.Mode.ACCEPT if accept else bl.Mode.REGEN if regen else bl.Mode.CHECK
    rdir = config.getoption("--amp-report-dir")
    report_dir = None if config.getoption("--amp-no-report") else Path(rdir) if rdir else rootdir / "amp-reports"
    return Options(
        devices=devices,
        dtypes=tuple(dict.fromkeys(raw)),
        profile=profile,
        tier=str(config.getoption("--amp-tier")),
        baseline_dir=baseline_dir,
        mode=mode,
        report_dir=report_dir,
    )


def _check_cuda_request(devices: str) -> None:
    if not devices.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError(f"--amp-device={devices}: {_cuda_missing_reason()}")
    index = int(devices.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise pytest.UsageError(f"--amp-device={devices}: only {torch.cuda.device_count()} CUDA device(s) visible")


def _cuda_missing_reason() -> str:
    import torch

    if torch.version.cuda is None:
        return f"CUDA is missing: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    return (
        f"CUDA is missing: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU "
        "(no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)"
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "quick: part of the quick tier (runs in every tier)",
        "thorough: heavy check, runs only with --amp-tier=thorough",
        "cuda: needs a CUDA device; skipped with the reason when none is present",
        "amp_suite(name): the suite name used for baselines and report rows (default: the directory under suites/)",
    ):
        config.addinivalue_line("markers", line)
    options = _parse_options(config)
    _check_cuda_request(options.devices)
    _register_hypothesis_profiles(config, options.tier)
    workerinput = getattr(config, "workerinput", None)
    run_id = workerinput.get("amp_run_id") if workerinput else None
    config.stash[STATE] = State(
        options=options,
        rootdir=Path(config.rootpath),
        run_id=run_id or rp.new_run_id(),
        started=rp.now_iso(),
        store=bl.BaselineStore(options.baseline_dir),
        is_worker=workerinput is not None,
        worker_id=workerinput.get("workerid") if workerinput else None,
    )


_PREVIOUS_HYPOTHESIS_PROFILE = pytest.StashKey[str]()


def _register_hypothesis_profiles(config: pytest.Config, tier: str) -> None:
    from hypothesis import settings

    config.stash[_PREVIOUS_HYPOTHESIS_PROFILE] = settings.get_current_profile_name()
    for name, kw in HYPOTHESIS_PROFILES.items():
        settings.register_profile(name, deadline=None, print_blob=True, **kw)
    # An explicit --hypothesis-profile is loaded afterwards by hypothesis' own plugin and wins.
    if not config.getoption("--hypothesis-profile", default=None):
        settings.load_profile("thorough" if tier == "thorough" else "ci" if os.environ.get("CI") else "dev")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Hypothesis profiles are process-global: give back the one that was active (in-process runs)."""
    previous = config.stash.get(_PREVIOUS_HYPOTHESIS_PROFILE, None)
    if previous is not None:
        from hypothesis import settings

        settings.load_profile(previous)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: give every worker the same run id."""
    node.workerinput["amp_run_id"] = state_of(node.config).run_id


# -- collection -------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    st = state_of(metafunc.config)
    if "amp_device" in metafunc.fixturenames:
        worker = getattr(metafunc.config, "workerinput", {}).get("workerid")
        devices = _selected_devices(st.options.devices, worker)
        # ids without the index: every xdist worker must collect the same test ids
        metafunc.parametrize("amp_device", devices, indirect=True, ids=[d.split(":")[0] for d in devices])
    if "amp_dtype" in metafunc.fixturenames:
        metafunc.parametrize("amp_dtype", list(st.options.dtypes), indirect=True)


def gpu_for_worker(worker_id: str | None, gpus: int) -> int:
    """Under pytest-xdist each worker (gw0, gw1, ...) gets its own GPU, round robin."""
    if not worker_id or gpus <= 0:
        return 0
    digits = "".join(ch for ch in worker_id if ch.isdigit())
    return int(digits or 0) % gpus


def _selected_devices(devices: str, worker_id: str | None = None) -> list[str]:
    if devices == "auto" or devices == "cuda":
        import torch

        if not torch.cuda.is_available():
            return ["cpu"]
        gpu = f"cuda:{gpu_for_worker(worker_id, torch.cuda.device_count())}"
        return ["cpu", gpu] if devices == "auto" else [gpu]
    return [devices]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    st = state_of(config)
    rank = TIERS.index(st.options.tier)
    cuda_reason: str | None = None
    for item in items:
        tier = (
            "thorough"
            if item.get_closest_marker("thorough")
            else "quick"
            if item.get_closest_marker("quick")
            else "default"
        )
        if TIERS.index(tier) > rank:
            item.add_marker(pytest.mark.skip(reason=f"{tier} tier: run with --amp-tier={tier}"))
        if item.get_closest_marker("cuda"):
            if cuda_reason is None:
                import torch

                cuda_reason = "" if torch.cuda.is_available() else _cuda_missing_reason()
            if cuda_reason:
                item.add_marker(pytest.mark.skip(reason=cuda_reason))


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        state_of(items[0].config).deselected += len(items)


def suite_of(item: pytest.Item) -> str:
    """Suite name: the ``amp_suite`` marker, else the directory under ``suites/``, else the module name."""
    marker = item.get_closest_marker("amp_suite")
    if marker is not None and marker.args:
        return str(marker.args[0])
    parts = Path(str(item.path)).parts
    if "suites" in parts:
        i = len(parts) - 1 - parts[::-1].index("suites")
        if i + 2 < len(parts):
            return parts[i + 1]
    return Path(str(item.path)).stem.removeprefix("test_")


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def amp_device(request: pytest.FixtureRequest) -> torch.device:
    """The device under test (parametrized by --amp-device)."""
    import torch

    state_of(request.config).activated = True
    return torch.device(str(request.param))


@pytest.fixture
def amp_dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """The autocast dtype under test (parametrized by --amp-dtypes)."""
    import torch

    state_of(request.config).activated = True
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
    """What hardware detection saw."""
    st = state_of(request.config)
    st.activated = True
    return st.fingerprint


@pytest.fixture
def amp_profile(request: pytest.FixtureRequest) -> str:
    """The hardware profile id of the run's primary device."""
    st = state_of(request.config)
    st.activated = True
    return st.profile_for(st.primary_device)


class Recorder:
    """Records measurements of one test as report rows; ``require`` also fails the test."""

    def __init__(self, state: State, item: pytest.Item) -> None:
        self._state, self._item = state, item
        self.suite = suite_of(item)
        self.check = getattr(item, "originalname", item.name)

    def __call__(
        self,
        metric: str,
        value: float | int | bool | None,
        *,
        check: str | None = None,
        unit: str = "",
        expected: float | None = None,
        allowance: float | None = None,
        outcome: str = "info",
        dtype: object = "",
        device: object = "",
        tags: dict[str, Any] | None = None,
        note: str = "",
    ) -> None:
        dev = str(device)
        row = rp.make_row(
            run_id=self._state.run_id,
            nodeid=self._item.nodeid,
            suite=self.suite,
            check=check or self.check,
            metric=metric,
            value=value,
            unit=unit,
            expected=expected,
            allowance=allowance,
            outcome=outcome,
            dtype=dtype,
            device=dev,
            profile=self._state.profile_for(dev or "cpu"),
            tags=tags,
            note=note,
        )
        self._state.rows.append(row.as_dict())

    def result(self, result: AnyComparison, **kw: Any) -> bool:
        """Record a comparison result as a row; returns whether it passed."""
        outcome = "pass" if result.passed else "fail"
        if isinstance(result, ScalarComparison):
            self(
                result.name,
                result.actual,
                expected=result.expected,
                allowance=result.allowed,
                unit=result.unit,
                outcome=outcome,
                note=result.tolerance.origin,
                **kw,
            )
        elif isinstance(result, BoundComparison):
            self(
                result.name,
                result.value,
                allowance=result.bound,
                unit=result.unit,
                outcome=outcome,
                note=result.origin,
                **kw,
            )
        elif isinstance(result, ElementwiseComparison):
            tags = {"total": result.total, **kw.pop("tags", {})}
            self(
                f"{result.name}.mismatched",
                result.count,
                expected=0,
                allowance=0,
                unit="elements",
                outcome=outcome,
                tags=tags,
                note=result.criterion,
                **kw,
            )
        else:
            assert isinstance(result, DataComparison)
            self(
                f"{result.name}.differences",
                len(result.differences),
                expected=0,
                allowance=0,
                unit="values",
                outcome=outcome,
                note=result.tolerance.origin,
                **kw,
            )
        return result.passed

    def property_run(self, metric: str, criterion: str, **kw: Any) -> AbstractContextManager[Tally]:
        """Wrap a hypothesis run: one row with the examples seen and the worst value, pass or fail."""
        return _tallied(self, metric, criterion, kw)

    def require(self, result: AnyComparison, **kw: Any) -> None:
        """Record ``result`` and fail the test with its explanation if it did not pass."""
        if not self.result(result, **kw):
            raise AssertionError(explain(result))


@dataclass
class Tally:
    """What a property run saw: examples, elements, and the worst measured value against its bound."""

    examples: int = 0
    elements: int = 0
    worst: float | None = None
    bound: float | None = None
    unit: str = ""
    #: how the bound of the worst example was derived (recorded in the row's tags)
    detail: str = ""

    def add(self, elements: int, worst: float | None = None, detail: str = "") -> None:
        self.examples += 1
        self.elements += elements
        if worst is not None and (self.worst is None or worst > self.worst):
            self.worst, self.detail = worst, detail or self.detail


@contextmanager
def _tallied(recorder: Recorder, metric: str, criterion: str, kw: dict[str, Any]) -> Iterator[Tally]:
    tally = Tally()
    outcome = "fail"
    try:
        yield tally
        outcome = "pass"
    finally:
        tags = {"examples": tally.examples, "elements": tally.elements, **kw.pop("tags", {})}
        if tally.detail:
            tags["derivation"] = tally.detail
        if tally.worst is not None:
            recorder(
                metric,
                tally.worst,
                allowance=tally.bound,
                unit=tally.unit,
                outcome=outcome,
                tags=tags,
                note=criterion,
                **kw,
            )
        else:
            recorder(metric, tally.elements, unit="elements checked", outcome=outcome, tags=tags, note=criterion, **kw)


@pytest.fixture
def amp_record(request: pytest.FixtureRequest) -> Recorder:
    """Record measurements as rows of the run report: ``amp_record(metric, value, ...)``,
    ``amp_record.require(comparison)``."""
    st = state_of(request.config)
    st.activated = True
    return Recorder(st, request.node)


@pytest.fixture
def amp_hardware_profile(request: pytest.FixtureRequest) -> Any:
    """The :class:`harness.storage.profiles.Profile` (thresholds, peaks) of the device under test."""
    from harness.storage import profiles

    st = state_of(request.config)
    st.activated = True
    device = str(request.getfixturevalue("amp_device")) if "amp_device" in request.fixturenames else st.primary_device
    try:
        return profiles.load(st.options.baseline_dir, st.profile_for(device))
    except profiles.ProfileFileError as exc:
        pytest.fail(str(exc), pytrace=False)


class TrainingChecks:
    """Bring your own model: ``amp_training.check(setup, recipes)`` runs the parity, determinism
    and gradient-census checks of the training suite on your model, records rows, and fails the
    test with every miss. ``setup`` is a :class:`harness.domains.training.Setup` (model factory, batch
    function, loss, steps, lr, optimizer)."""

    def __init__(self, recorder: Recorder, device: torch.device) -> None:
        self._record, self._device = recorder, device

    def check(self, setup: Any, recipes: Any, seeds: int = 3, determinism: bool = True, census: bool = True) -> Any:
        from harness.domains import training as T

        report = T.check_parity(setup, recipes, seeds=seeds, device=self._device)
        failures = []
        for r in report.results:
            ok = r.parity.passed if not r.recipe.control else r.parity.worst >= T.CONTROL_FACTOR
            self._record(
                f"{setup.name}.{r.recipe.name}.worst_diff_over_allowance",
                r.parity.worst,
                allowance=1.0,
                outcome="pass" if ok else "fail",
                device=self._device,
                tags={"control": r.recipe.control, "skipped_steps": r.run.skipped_at},
            )
            if not ok:
                want = f">= {T.CONTROL_FACTOR} (negative control)" if r.recipe.control else "<= 1"
                failures.append(f"{r.recipe.name}: worst |diff|/allowance {r.parity.worst:.3g}, needs {want}")
        if determinism:
            for recipe in recipes:
                same, first = T.is_deterministic(setup, recipe, self._device)
                self._record(
                    f"{setup.name}.{recipe.name}.deterministic",
                    same,
                    outcome="pass" if same else "fail",
                    device=self._device,
                )
                if not same:
                    failures.append(f"{recipe.name}: nondeterministic from step {first}")
        if census:
            c = T.gradient_census(T.fp32_gradients(setup, device=self._device))
            self._record(f"{setup.name}.grad.underflow_share", c["underflow_share"], unit="share", device=self._device)
            self._record(f"{setup.name}.grad.subnormal_share", c["subnormal_share"], unit="share", device=self._device)
        if failures:
            raise AssertionError(f"training checks of {setup.name!r} failed:\n  " + "\n  ".join(failures))
        return report


@pytest.fixture
def amp_training(amp_record: Recorder, request: pytest.FixtureRequest) -> TrainingChecks:
    """Parity, determinism and census checks for a model of yours (see harness.domains.training.Setup)."""
    import torch

    device = request.getfixturevalue("amp_device") if "amp_device" in request.fixturenames else torch.device("cpu")
    return TrainingChecks(amp_record, device)


class Baselines:
    """``amp_baseline.check(name, data, key=KeyKind.STACK)`` against ``baselines/<suite>/<key>/<name>.json``."""

    def __init__(self, state: State, item: pytest.Item, recorder: Recorder) -> None:
        self._state, self._item, self._record = state, item, recorder

    def regen_command(self) -> str:
        extra = f" --amp-profile={self._state.options.profile}" if self._state.options.profile else ""
        if self._state.options.baseline_dir != self._state.rootdir / "baselines":
            extra += f" --amp-baseline-dir={shlex.quote(str(self._state.options.baseline_dir))}"
        return f"pytest {shlex.quote(self._item.nodeid)} --amp-regen{extra}"

    def check(
        self,
        name: str,
        data: Any,
        *,
        key: bl.KeyKind = bl.KeyKind.STACK,
        tolerance: Tolerance = EXACT,
        device: str | None = None,
        comparator: Callable[[Any, Any], DataComparison] | None = None,
    ) -> None:
        st = self._state
        dev = device or st.primary_device
        profile = st.profile_for(dev)
        fp = st.fingerprint
        outcome = bl.check(
            st.store,
            suite=self._record.suite,
            name=name,
            key=bl.key_for(key, profile, fp.torch_minor),
            key_kind=key,
            data=data,
            provenance=provenance(fp, device=dev, profile=profile, commit=st.commit),
            mode=st.options.mode,
            regen_command=self.regen_command(),
            tolerance=tolerance,
            display=_display,
            comparator=comparator,
        )
        st.used.add(str(outcome.path))
        diffs = 0 if outcome.comparison is None else len(outcome.comparison.differences)
        self._record(
            f"baseline.{name}",
            diffs,
            unit="values differing",
            expected=0,
            allowance=0,
            outcome="pass" if outcome.passed else "fail",
            device=dev,
            tags={"baseline": _display(outcome.path), "mode": st.options.mode.value},
            note=outcome.message.splitlines()[0] if outcome.message else "",
        )
        if not outcome.passed:
            pytest.fail(outcome.message, pytrace=False)


def _display(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


@pytest.fixture
def amp_baseline(request: pytest.FixtureRequest, amp_record: Recorder) -> Baselines:
    """Golden baselines with the pytest-regressions lifecycle (see --amp-regen, --amp-accept-all)."""
    return Baselines(state_of(request.config), request.node, amp_record)


# -- session end ------------------------------------------------------------------------------
@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Count test outcomes for the run metadata."""
    rep = yield
    st = state_of(item.config)
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        key = "xfailed" if hasattr(rep, "wasxfail") and rep.skipped else rep.outcome
        st.test_outcomes[key] = st.test_outcomes.get(key, 0) + 1
    return rep


def pytest_sessionfinish(session: pytest.Session) -> None:
    st = state_of(session.config)
    st.written = [str(p) for p in st.store.flush()]
    if st.is_worker:
        session.config.workeroutput[_WORKER_KEY] = {  # type: ignore[attr-defined]
            "rows": st.rows,
            "activated": st.activated,
            "written": st.written,
            "used": sorted(st.used),
            "outcomes": st.test_outcomes,
        }
        return
    if st.report_path is None and st.options.report_dir is not None and (st.activated or st.rows):
        st.report_path = rp.write(st.options.report_dir, st.run_id, st.rows, _run_meta(session, st))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: merge a worker's rows, writes and used baselines."""
    out = getattr(node, "workeroutput", {}).get(_WORKER_KEY)
    if not out:
        return
    st = state_of(node.config)
    st.rows.extend(out["rows"])
    st.activated |= bool(out["activated"])
    st.written.extend(out["written"])
    st.used.update(out["used"])
    for k, v in out["outcomes"].items():
        st.test_outcomes[k] = st.test_outcomes.get(k, 0) + v


def _run_meta(session: pytest.Session, st: State) -> dict[str, Any]:
    fp = st.fingerprint
    cfg = session.config
    return {
        "harness_version": __version__,
        "started": st.started,
        "finished": rp.now_iso(),
        "fingerprint": fp.as_dict(),
        "profile": st.profile_for(st.primary_device),
        "primary_device": st.primary_device,
        "git_commit": st.commit,
        "options": {
            "devices": st.options.devices,
            "dtypes": list(st.options.dtypes),
            "profile_override": st.options.profile,
            "tier": st.options.tier,
            "baseline_mode": st.options.mode.value,
            "hypothesis_profile": _hypothesis_profile_name(),
            "hypothesis_seed": cfg.getoption("--hypothesis-seed", default=None),
        },
        "invocation": list(cfg.invocation_params.args),
        "tests": dict(st.test_outcomes),
        "exitstatus": int(session.exitstatus),
        "row_outcomes": rp.summarize(st.rows),
    }


def _hypothesis_profile_name() -> str:
    from hypothesis import settings

    return settings.get_current_profile_name()


def _unused_baselines(st: State) -> list[str]:
    used = {Path(p) for p in st.used}
    stored: set[Path] = set()
    for d in {p.parent for p in used}:
        stored |= {p for p in d.glob(f"*{bl.SUFFIX}") if not p.name.endswith(bl.OBTAINED_SUFFIX)}
    return sorted(str(p) for p in stored - used)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    st = state_of(config)
    if st.is_worker:
        return
    lines: list[str] = []
    if st.written:
        lines.append(f"baselines written: {len(st.written)}")
        lines += [f"  {_display(Path(p))}" for p in sorted(st.written)]
    unused = _unused_baselines(st)
    if unused:
        why = f" ({st.deselected} deselected tests may use them)" if st.deselected else ""
        lines.append(f"baselines not used by any collected check in their directories{why}:")
        lines += [f"  {_display(Path(p))}" for p in unused]
    if st.report_path is not None:
        counts = rp.summarize(st.rows)
        detail = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        lines.append(f"run report: {len(st.rows)} rows ({detail or 'none'}) -> {_display(st.report_path)}")
    if lines:
        terminalreporter.write_sep("-", "amp-harness")
        for line in lines:
            terminalreporter.write_line(line)
