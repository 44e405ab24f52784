"""Every command the user-facing pages show (README, docs/running.md, docs/release.md,
docs/qualify.md) is proven where users run it: run as written from a copy of the repository, with
the project's own configuration (its addopts' two xdist workers included), or named with the test
or CI step that runs it, or with the reason it cannot run on these machines. A command added to
those pages, or changed there, fails here until it says which.

The runs are in the opt-in tier (each starts the CLI or pytest in fresh interpreters, one a whole
qualification); CI runs them: `pytest tests/ -m as_users_run_it --amp-tier=thorough`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import REPO, outside_this_run

pytestmark = pytest.mark.as_users_run_it

#: the pages whose fenced shell blocks are the commands users copy
PAGES = ("README.md", "docs/running.md", "docs/release.md", "docs/qualify.md")


@dataclass(frozen=True)
class Run:
    """Run as written here, in a copy of the repository: ``then`` says what must hold."""

    then: str


@dataclass(frozen=True)
class Elsewhere:
    """Run by a test (``path::name``) or by CI (``.ci/run``), as the note says."""

    where: str
    note: str


@dataclass(frozen=True)
class NotHere:
    """Cannot run on these machines, and why."""

    why: str


CI_INSTALL = Elsewhere(".ci/run", "CI runs it as written on a fresh machine before every other step")
PROOF: dict[str, Run | Elsewhere | NotHere] = {
    "python3 -m venv .venv && . .venv/bin/activate": CI_INSTALL,
    'pip install -c constraints/cpu.txt -e ".[dev]"': CI_INSTALL,
    'pip install -e ".[dev]"': NotHere(
        "a GPU host's install, keeping its CUDA torch; on these CPU machines it pulls a multi-GB CUDA build"
    ),
    "pytest": Elsewhere(".ci/run", "CI runs `pytest` as written, from the repository root, under its addopts"),
    "pytest suites/": Elsewhere(
        ".ci/run", "part of `pytest`, which CI runs as written; CI runs it again under the Zen 4 and AVX2 kernel sets"
    ),
    "amp-harness qualify": Run("after `amp-harness calibrate --compiled`, speed is judged (never NOT JUDGED)"),
    "amp-harness qualify --optional speed,memory -- --amp-device=cuda:0": Run(
        "on a machine without CUDA: exit 4, quoting pytest's reason (CUDA is missing)"
    ),
    "amp-harness qualify tests/": Elsewhere(
        "tests/test_qualify.py::test_qualify_judges_a_users_project_by_the_fixtures_its_tests_use",
        "a user's own project's tests/ qualified; here it would run the harness's own tests",
    ),
    "pytest suites/formats/test_fp8_casts.py --amp-regen": Run("exit 0: the repository's baselines are current"),
    "git diff baselines/": Run("nothing changed: a regen of current baselines rewrites no file"),
    "torchrun --nproc_per_node=8 -m pytest suites/distributed --amp-report-dir=amp-reports": Elsewhere(
        "tests/test_launched_world.py::test_under_torchrun_one_report_holds_every_ranks_rows",
        "two CPU ranks with gloo (no GPUs here), under the project's configuration",
    ),
    "torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --master_addr=$HEAD --master_port=29500 -m pytest "
    "suites/distributed --amp-report-dir=amp-reports": Elsewhere(
        "tests/test_launched_world.py::test_two_nodes_write_one_report_of_four_ranks_and_one_ranks_fault_fails_on_all",
        "both nodes on this host: $HEAD is 127.0.0.1, two ranks a node, under the project's configuration",
    ),
    "torchrun --nnodes=2 --nproc_per_node=8 --node_rank=1 --master_addr=$HEAD --master_port=29500 -m pytest "
    "suites/distributed --amp-report-dir=amp-reports": Elsewhere(
        "tests/test_launched_world.py::test_two_nodes_write_one_report_of_four_ranks_and_one_ranks_fault_fails_on_all",
        "node rank 1 of the same two-node world",
    ),
    "srun --nodes=2 --ntasks-per-node=1 torchrun --nnodes=2 --nproc_per_node=8 --rdzv_backend=c10d "
    '--rdzv_endpoint=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1):29500 --rdzv_id=$SLURM_JOB_ID '
    "-m pytest suites/distributed --amp-report-dir=amp-reports": NotHere(
        "no Slurm on these machines; what srun starts on each node is the two-node torchrun recipe, tested above"
    ),
    '[ "$RANK" = 0 ] && amp-harness publish amp-reports/ --fleet s3://qual-bucket/amp-fleet': Elsewhere(
        "tests/test_fleet_object_store.py::test_three_runners_publish_at_once_and_every_view_equals_the_local_directorys",
        "publishing into an S3-API store served on the loopback (no bucket on the internet is reachable here)",
    ),
    "amp-harness release torch==2.15.0 --with torchao==0.18.0": Elsewhere(
        "tests/test_release_report.py::test_the_command_judges_two_reports_and_says_what_is_missing",
        "the judging of the two runs; the install is a CUDA build of about 7 GB a release, done by hand (docs/release.md)",
    ),
    "amp-harness release torch==2.16.0.dev20261201 --with=--pre --with=--index-url=URL": NotHere(
        "a nightly's index is not reachable from these machines (PyPI only)"
    ),
    "amp-harness release ./torch-2.15.0-cp311-cp311-linux_x86_64.whl": Elsewhere(
        "tests/test_release_report.py::test_the_command_judges_two_reports_and_says_what_is_missing",
        "a local wheel installs as a release from PyPI does; the judging is the same",
    ),
    "scripts/gpu-qualify.sh OUT_DIR": NotHere("needs a GPU host; its CPU dry run below is the same flow"),
    "AMP_DEVICE=cpu scripts/gpu-qualify.sh /tmp/dry": Elsewhere(
        "tests/test_gpu_qualify_script.py::test_a_cpu_dry_run_packs_baselines_report_junit_and_log",
        "the dry run with one calibration case and one suite test, twice (the resume)",
    ),
}


def documented_commands() -> dict[str, str]:
    """Each command of the pages' fenced shell blocks (continuation lines joined, comments and
    spacing dropped), with the first page that shows it."""
    found: dict[str, str] = {}
    for page in PAGES:
        text = (REPO / page).read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+", " ", re.sub(r"\s+#.*$", "", line)).strip()
                if command and not command.startswith("#"):
                    found.setdefault(command, page)
    return found


def test_every_documented_command_says_how_it_is_proven():
    documented = documented_commands()
    unproven = {c: page for c, page in documented.items() if c not in PROOF}
    assert not unproven, (
        f"documented commands with no proof: {unproven}; add each to PROOF in {Path(__file__).name}: "
        "Run (this file runs it as written), Elsewhere (the test or CI step that runs it) or NotHere (why it cannot run)"
    )
    stale = sorted(set(PROOF) - set(documented))
    assert not stale, f"PROOF names commands no page shows any more: {stale}"


def test_every_test_named_as_a_proof_exists():
    for command, proof in PROOF.items():
        if not isinstance(proof, Elsewhere) or proof.where == ".ci/run":
            continue
        path, _, name = proof.where.partition("::")
        assert re.search(rf"^def {re.escape(name)}\(", (REPO / path).read_text(encoding="utf-8"), re.M), (
            f"{command!r} is said to be proven by {proof.where}, which does not exist"
        )
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^pytest$", ci, re.M) and "-m as_users_run_it --amp-tier=thorough" in ci


# -- run as written ----------------------------------------------------------------------------
@pytest.fixture
def repository(tmp_path, monkeypatch) -> Path:
    """A copy of the repository as a clone of this checkout has it (no reports, caches or
    environments), its own git history of one commit, and this environment's commands first on PATH."""
    copy = tmp_path / "repo"
    listed = subprocess.run(  # what a clone holds, with this checkout's changes: git's own rules of what to leave out
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():  # a file deleted in the checkout but still tracked is not there
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
    outside_this_run(monkeypatch)
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=copy, check=True)
    subprocess.run([*git, "add", "-A"], cwd=copy, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], cwd=copy, check=True)
    return copy


def _as_written(repository: Path, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    assert command in PROOF and isinstance(PROOF[command], Run), f"{command!r} is not one this file runs"
    return subprocess.run(
        ["bash", "-c", command], cwd=repository, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.amp_thorough
def test_a_regen_of_current_baselines_passes_and_changes_no_file(repository):
    run = _as_written(repository, "pytest suites/formats/test_fp8_casts.py --amp-regen", timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "created: 2/2 workers" in run.stdout  # under the project's configuration
    diff = _as_written(repository, "git diff baselines/", timeout=60)
    assert diff.returncode == 0 and diff.stdout == "", diff.stdout[-3000:]


@pytest.mark.amp_thorough
def test_qualifying_on_a_named_cuda_device_without_one_is_a_usage_error_naming_what_is_missing(repository):
    import torch

    if torch.cuda.is_available():
        pytest.skip(
            "this machine has CUDA: the command is a whole qualification there (scripts/gpu-qualify.sh runs it)"
        )
    run = _as_written(repository, "amp-harness qualify --optional speed,memory -- --amp-device=cuda:0", timeout=300)
    assert run.returncode == 4, run.stdout[-3000:] + run.stderr[-2000:]
    assert "CUDA is missing" in run.stdout + run.stderr


@pytest.mark.amp_thorough
@pytest.mark.amp_timing  # it calibrates and times the speed suite: under xdist, with the machine alone
def test_after_the_calibration_it_asks_for_qualify_judges_speed(repository):
    """`amp-harness qualify` runs `pytest suites/` under the project's addopts (two xdist workers);
    on an uncalibrated machine speed is NOT JUDGED and the reason names `amp-harness calibrate`.
    After it, speed is judged: the workers' hardware class is the one calibration wrote."""
    # the README's calibration, and the fp8 speed case's, which the fp8 suite's NOT JUDGED names
    for argv in (["--compiled"], ["--cases", "scaled_mm_e4m3/float8_e4m3fn"]):
        calibrate = subprocess.run(
            ["amp-harness", "calibrate", *argv],
            cwd=repository,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert calibrate.returncode == 0, calibrate.stdout[-3000:] + calibrate.stderr[-2000:]
    run = _as_written(repository, "amp-harness qualify", timeout=900)
    assert run.returncode in (0, 1, 2), run.stdout[-3000:] + run.stderr[-2000:]
    [verdict_file] = (repository / "amp-reports").glob("*/verdict.json")
    verdicts = json.loads(verdict_file.read_text())
    speed = next(c for c in verdicts["verdicts"] if c["capability"] == "speed")
    assert speed["status"] in ("PASS", "NOISY"), (speed, run.stdout[-3000:])
