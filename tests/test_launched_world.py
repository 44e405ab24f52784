"""The distributed suite on the world a launcher starts: ``torchrun`` runs pytest on every rank;
the checks run on that world (gloo here), every rank judges every rank's results, and rank 0
alone writes one run report holding every rank's rows (rank, local rank, host in their tags)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest
from helpers import inject

from harness.storage import report as rp

SUITE = "distributed/test_mixed_precision_distributed.py"
FP32_ALLREDUCE = "test_ddp_fp32_allreduce_averages_gradients_within_the_fp32_budget_of_one_process"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun(pytester, *pytest_args: str, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node=N -m pytest`` in the pytester directory, on the loopback."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
        f"--master_port={_port()}", "-m", "pytest", "-p", "no:cacheprovider", "-q",
        f"--amp-report-dir={pytester.path / 'out'}", *pytest_args,
    ]  # fmt: skip
    return subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, timeout=timeout, check=False)


#: every torchrun test starts two pytest processes (about 9 s each on 2 cores): the opt-in tier, which
#: .ci/run runs on its own after the default one
pytestmark = pytest.mark.amp_thorough


def test_without_a_launcher_or_with_one_rank_there_is_no_launched_world(monkeypatch):
    from harness.domains.distributed import world as W

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert W.launched() is None
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert W.launched() is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = W.launched()
    assert w is not None and (w.rank, w.world_size, w.local_rank) == (3, 4, 1)


def test_under_torchrun_one_report_holds_every_ranks_rows(pytester, suite_copy):
    suite_copy(SUITE)
    run = _torchrun(pytester, "-k", FP32_ALLREDUCE)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [report] = rp.find_runs(pytester.path / "out")  # one report, not one per rank
    rows = rp.load(report).rows
    tags = [json.loads(t) for t in rows["tags"]]
    assert {t["rank"] for t in tags} == {0, 1} and {t["world_size"] for t in tags} == {2}
    assert all(t["host"] and "local_rank" in t for t in tags)


def test_a_fault_on_one_ranks_reduction_fails_the_check_on_every_rank(pytester, suite_copy):
    suite_copy(SUITE)
    inject(
        pytester, "distributed", fixtures={"ddp_plain_hook": repr("faults.distributed:allreduce_corrupted_on_rank_1")}
    )
    run = _torchrun(pytester, "-k", FP32_ALLREDUCE)
    assert run.returncode != 0
    # both ranks' pytest sessions report the same failed check
    assert run.stdout.count(f"FAILED suites/{SUITE}::{FP32_ALLREDUCE}") == 2, run.stdout[-3000:]


def test_a_rank_that_dies_ends_every_rank_promptly_and_is_named(pytester):
    pytester.makepyfile(
        test_dies="""
from harness.domains.distributed import ranks

def test_the_launch_on_the_launched_world():
    ranks.launch("faults.distributed:rank_1_dies", world=2)
"""
    )
    inject(pytester, "", fixtures={})
    start = time.monotonic()
    run = _torchrun(pytester, timeout=200)
    took = time.monotonic() - start
    assert run.returncode != 0 and took < 120, (took, run.stdout[-2000:], run.stderr[-2000:])
    assert "rank      : 1" in run.stderr and "exitcode  : 3" in run.stderr, run.stderr[-3000:]
