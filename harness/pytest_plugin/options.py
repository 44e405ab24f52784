"""Command-line options of the plugin, parsed once into a frozen :class:`Options`.

Bad values are usage errors that say what is accepted; nothing is silently replaced.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.platform.hardware import ProfileError, validate_profile
from harness.pytest_plugin.limits import DEFAULT_HEAVY_LIMIT_S, DEFAULT_LIMIT_S, HEAVY_SUITES
from harness.storage import baselines as bl

TIERS = ("quick", "default", "thorough")
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")

#: hypothesis settings profiles of amp-harness tests. Namespaced: hypothesis has a built-in ``ci``
#: profile that other projects rely on, and a registered profile is process-global.
#: ``amp-ci``, the default, is reproducible run to run: a qualification run gives the same verdict
#: and the same property rows every time (the dashboard compares them); ``amp-dev`` draws more
#: random examples for exploring, ``amp-thorough`` is the thorough tier's.
HYPOTHESIS_PROFILES: dict[str, dict[str, Any]] = {
    "amp-ci": {"max_examples": 40, "derandomize": True, "database": None},
    "amp-dev": {"max_examples": 100},
    "amp-thorough": {"max_examples": 1000},
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
    #: where new, regenerated and obtained baselines go instead of ``baseline_dir`` (None: there)
    candidates_dir: Path | None = None
    #: qualification policy: AMP must be faster than fp32 on every judged speed case
    require_speedup: bool = False
    #: torch threads of an xdist worker: "auto", "off" or a number (:func:`worker_threads`)
    worker_threads: str = "auto"
    #: seconds an amp-harness test may run before it is stopped as HUNG (0: no limit)
    timeout_s: float = DEFAULT_LIMIT_S
    #: the same for the distributed and compiled suites (:data:`harness.pytest_plugin.limits.HEAVY_SUITES`)
    heavy_timeout_s: float = DEFAULT_HEAVY_LIMIT_S
    #: run the tests in a worker process that is replaced when a test crashes it (pytest-xdist)
    isolate: bool = False
    #: a report directory holding earlier parts of this qualification: its finished tests are deselected
    resume_dir: Path | None = None

    @property
    def hypothesis_profile(self) -> str:
        """The profile the run loads unless ``--hypothesis-profile`` names another."""
        return "amp-thorough" if self.tier == "thorough" else "amp-ci"


def add_options(parser: pytest.Parser) -> None:
    parser.addini(
        "amp_self_tests",
        "paths (relative to the rootdir) whose tests are the project's tests of itself, not qualification: their "
        "rows and results carry origin self-test, the dashboard and qualify keep them apart, diff ranks them apart",
        type="linelist",
        default=[],
    )
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
        help="hardware profile id that keys per-profile baselines (e.g. cpu-avx512bf16, nvidia-h200). "
        "Default: detected from the machine; an unknown id is an error listing the known ones.",
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
        help="root of the golden baselines and hardware-class profiles (default: <rootdir>/baselines).",
    )
    g.addoption(
        "--amp-candidates-dir",
        default=None,
        help="never write under the baseline directory (a read-only checkout in CI): new, regenerated and "
        "obtained baselines go to the same relative path under this directory instead, for review.",
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
    g.addoption(
        "--amp-worker-threads",
        default="auto",
        help="torch threads of each pytest-xdist worker: auto (default: the CPUs this process may use, shared "
        "equally among the workers, at least 1; left alone when OMP_NUM_THREADS is set), off (torch's own "
        "default: every worker uses every core, and the workers' thread pools fight), or a number.",
    )
    g.addoption(
        "--amp-timeout",
        default=None,
        metavar="SECONDS",
        help=f"time limit of each amp-harness test (default {DEFAULT_LIMIT_S:g}; 0: none): past it the test is "
        "stopped, HUNG, with the stacks of its process's threads, and the run goes on. A test stuck in native code "
        "is ended with its process a tenth of the limit later (survived with --amp-isolate or -n).",
    )
    g.addoption(
        "--amp-timeout-heavy",
        default=None,
        metavar="SECONDS",
        help=f"the same for the {' and '.join(HEAVY_SUITES)} suites (default {DEFAULT_HEAVY_LIMIT_S:g}; 0: none).",
    )
    g.addoption(
        "--amp-isolate",
        action="store_true",
        help="run the tests in one pytest-xdist worker process that is replaced when a test crashes it (a segfault, "
        "an abort, the OOM killer) or hangs past the time limit in native code: the test is CRASHED or HUNG and the "
        "run goes on with the next one. Needs pytest-xdist.",
    )
    g.addoption(
        "--amp-resume",
        default=None,
        metavar="DIR",
        help="resume a qualification cut short: deselect the tests that already have a result in the run reports "
        "under DIR (its earlier parts; a dead session's journal there is recovered first). A test its cut session "
        "was running runs again, once. `amp-harness qualify --resume` judges the parts together.",
    )
    g.addoption(
        "--amp-require-speedup",
        action="store_true",
        help="qualification policy: every speed case must run faster under AMP than in fp32 (off by default: "
        "on CPUs AMP is often slower, which is a finding, not a regression).",
    )


def parse(config: pytest.Config) -> Options:
    """The options of this run; a usage error names the option, the value and what is accepted."""
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
        try:
            profile = validate_profile(str(profile))
        except ProfileError as exc:
            raise pytest.UsageError(f"--amp-profile: {exc}") from None
    regen, accept = bool(config.getoption("--amp-regen")), bool(config.getoption("--amp-accept-all"))
    if regen and accept:
        raise pytest.UsageError(
            "--amp-regen (rewrite and fail) and --amp-accept-all (rewrite and pass) exclude each other"
        )
    mode = bl.Mode.ACCEPT if accept else bl.Mode.REGEN if regen else bl.Mode.CHECK
    cdir = config.getoption("--amp-candidates-dir")
    candidates_dir = Path(cdir).resolve() if cdir else None
    if candidates_dir is not None and candidates_dir == baseline_dir.resolve():
        raise pytest.UsageError(
            f"--amp-candidates-dir={cdir}: it is the baseline directory itself; name a separate directory"
        )
    threads = str(config.getoption("--amp-worker-threads")).strip()
    if threads not in ("auto", "off") and not (threads.isdigit() and int(threads) >= 1):
        raise pytest.UsageError(f"--amp-worker-threads={threads!r}: expected auto, off or a positive integer")
    limits = {name: _seconds(config, name, default) for name, default in _LIMITS}
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
        candidates_dir=candidates_dir,
        require_speedup=bool(config.getoption("--amp-require-speedup")),
        worker_threads=threads,
        timeout_s=limits["--amp-timeout"],
        heavy_timeout_s=limits["--amp-timeout-heavy"],
        isolate=bool(config.getoption("--amp-isolate")),
        resume_dir=Path(str(config.getoption("--amp-resume"))) if config.getoption("--amp-resume") else None,
    )


_LIMITS = (("--amp-timeout", DEFAULT_LIMIT_S), ("--amp-timeout-heavy", DEFAULT_HEAVY_LIMIT_S))


def _seconds(config: pytest.Config, name: str, default: float) -> float:
    """A time limit in seconds: a non-negative number (0: none)."""
    raw = config.getoption(name)
    if raw is None:
        return default
    try:
        value = float(str(raw).strip())
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise pytest.UsageError(f"{name}={raw!r}: expected a number of seconds, 0 or more (0: no limit)")
    return value


def worker_threads(setting: str, workers: int, cpus: int, omp_env: str | None) -> tuple[int | None, str]:
    """The torch thread count of one of ``workers`` xdist workers on ``cpus`` CPUs, and why; None
    leaves torch's own. Each worker's torch otherwise starts a thread per core, so two workers on
    two cores run four busy threads and every parallel region waits for a preempted one."""
    if setting == "off":
        return None, "--amp-worker-threads=off: torch's default"
    if setting != "auto":
        return int(setting), f"--amp-worker-threads={setting}"
    if omp_env:
        return None, f"OMP_NUM_THREADS={omp_env} is set: left to it"
    share = max(1, cpus // max(1, workers))
    return share, f"{cpus} CPUs shared by {workers} xdist workers"


def cuda_missing_reason() -> str:
    """Why CUDA checks cannot run here (the skip reason of every CUDA-only check)."""
    import torch

    if torch.version.cuda is None:
        return f"CUDA is missing: torch {torch.__version__} is a CPU-only build (torch.version.cuda is None)"
    return (
        f"CUDA is missing: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU "
        "(no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides them)"
    )


def check_cuda_request(devices: str) -> None:
    """Naming CUDA where there is none is a usage error, not a run of skips."""
    if not devices.startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise pytest.UsageError(f"--amp-device={devices}: {cuda_missing_reason()}")
    index = int(devices.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise pytest.UsageError(f"--amp-device={devices}: only {torch.cuda.device_count()} CUDA device(s) visible")


def explicit_hypothesis_profile(config: pytest.Config) -> str | None:
    """The profile ``--hypothesis-profile`` names (it wins over the harness's choice), or None."""
    name = config.getoption("--hypothesis-profile", default=None)
    return str(name) if name else None


def register_hypothesis_profiles() -> None:
    """Register the harness's profiles with hypothesis (again: registering is idempotent). Called
    where they are needed, never at start-up: the plugin imports hypothesis only in a run that has
    amp-harness tests, names a profile, or has imported hypothesis already."""
    from hypothesis import settings

    for name, kw in HYPOTHESIS_PROFILES.items():
        settings.register_profile(name, deadline=None, print_blob=True, **kw)


def hypothesis_is_needed(config: pytest.Config) -> bool:
    """Whether the profiles must exist at configure time: ``--hypothesis-profile`` may name one of
    them (hypothesis loads it next), or the run has imported hypothesis already."""
    return explicit_hypothesis_profile(config) is not None or "hypothesis" in sys.modules


def self_test_prefixes(config: pytest.Config) -> tuple[str, ...]:
    """The node-id prefixes of ``amp_self_tests`` (``tests`` -> ``tests/``; a file as it is)."""
    out = []
    for line in config.getini("amp_self_tests"):
        p = str(line).strip().replace("\\", "/").strip("/")
        if p:
            out.append(p if p.endswith(".py") else p + "/")
    return tuple(out)
