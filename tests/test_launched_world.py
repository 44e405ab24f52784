"""The distributed suite on the world a launcher starts: ``torchrun`` runs pytest on every rank;
the checks run on that world (gloo here), every rank judges every rank's results, and rank 0
alone writes one run report holding every rank's rows (rank, local rank, host in their tags)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from helpers import inject, outside_this_run, project_configuration

from harness.domains.engines.ranks import world as W
from harness.storage import report as rp

SUITE = "distributed/test_mixed_precision_distributed.py"
FP32_ALLREDUCE = "test_ddp_fp32_allreduce_averages_gradients_within_the_fp32_budget_of_one_process"
#: the bandwidth metric: a timing, in the speed suite, run on the same launched world
INTERCONNECT = "speed/test_interconnect.py"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _torchrun_cmd(pytester, port: int, *pytest_args: str, nproc: int, nnodes: int = 1, node_rank: int = 0) -> list[str]:
    """``torchrun ... -m pytest`` for one node of the world, its endpoint on the loopback."""
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--node_rank={node_rank}",
        f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1", f"--master_port={port}",
        "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--amp-report-dir={pytester.path / 'out'}", *pytest_args,
    ]  # fmt: skip


def _torchrun(pytester, *pytest_args: str, nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node=N -m pytest`` in the pytester directory, on the loopback."""
    cmd = _torchrun_cmd(pytester, _port(), *pytest_args, nproc=nproc)
    return subprocess.run(cmd, cwd=pytester.path, capture_output=True, text=True, timeout=timeout, check=False)


def _two_nodes(pytester, *pytest_args: str) -> list[subprocess.Popen[str]]:
    """Two ``torchrun --nnodes=2 --nproc_per_node=2`` invocations, node ranks 0 and 1, one
    endpoint on 127.0.0.1: a 4-rank world as two hosts would start it."""
    port = _port()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return [
        subprocess.Popen(
            _torchrun_cmd(pytester, port, *pytest_args, nproc=2, nnodes=2, node_rank=n), cwd=pytester.path, **pipes
        )
        for n in (0, 1)
    ]


def _finish(nodes: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    """Wait for every node's torchrun (killing them all past ``timeout``): exit status, stdout, stderr."""
    try:
        outs = [(p.communicate(timeout=timeout), p.returncode) for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    return [(rc, out, err) for (out, err), rc in outs]


#: every torchrun test starts two pytest processes (about 9 s each on 2 cores): the opt-in tier, which
#: .ci/run runs on its own after the default one
pytestmark = pytest.mark.amp_thorough


@pytest.fixture(autouse=True)
def as_from_the_repository(pytester, monkeypatch):
    """Every run here starts as docs/running.md's recipes do from the repository: under the project's
    own configuration, whose addopts start two xdist workers (a launched rank must not)."""
    project_configuration(pytester)
    outside_this_run(monkeypatch)


def _launched_env(monkeypatch, rank: int, world_size: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("LOCAL_RANK", str(rank))


def test_a_launched_rank_runs_its_tests_itself_whatever_workers_the_addopts_ask_for(pytester, monkeypatch):
    """Under a launcher the rank processes are the world: xdist workers inside a rank would be no
    rank of it (the ranks waited in init_process_group until the launcher's timeout). Without the
    launcher, the same project runs on its two workers (the negative control)."""
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    plain.stdout.fnmatch_lines(["*created: 2/2 workers*", "*1 passed*"])
    _launched_env(monkeypatch, 1, 2)
    ranked = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "created:" not in ranked.stdout.str() and ranked.ret == pytest.ExitCode.OK, ranked.stdout.str()
    ranked.stdout.fnmatch_lines(["*rank 1 of a launched world of 2: xdist is off*", "*1 passed*"])
    isolated = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--amp-isolate")
    assert isolated.ret == pytest.ExitCode.USAGE_ERROR
    isolated.stderr.fnmatch_lines(["*rank 1 of a launched world of 2*drop --amp-isolate under a launcher*"])


def test_without_a_launcher_or_with_one_rank_there_is_no_launched_world(monkeypatch):
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


def test_a_rank_that_dies_ends_every_rank_promptly_and_is_named(pytester):
    pytester.makepyfile(
        test_dies="""
from harness.domains.engines.ranks import ranks

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


def test_two_nodes_write_one_report_of_four_ranks_and_one_ranks_fault_fails_on_all(pytester, suite_copy):
    """Two torchrun invocations of two ranks each (node ranks 0 and 1): one run report holding every
    rank's rows; rank 1's corrupted reduction fails the fp32 all-reduce check in all four sessions,
    the bandwidth metric (clean) is recorded from all four."""
    suite_copy(SUITE, INTERCONNECT)
    faulty = {"ddp_plain_hook": "faults.distributed:allreduce_corrupted_on_rank_1"}
    clean = {"allreduce_timed": "torch.distributed:all_reduce"}  # the injected conftest replaces the suite's
    inject(pytester, "distributed", fixtures={k: repr(v) for k, v in faulty.items()})
    inject(pytester, "speed", fixtures={k: repr(v) for k, v in clean.items()})
    nodes = _finish(_two_nodes(pytester, "-k", f"{FP32_ALLREDUCE} or bandwidth"), timeout=300)
    assert all(rc != 0 for rc, _, _ in nodes), nodes
    for _, out, err in nodes:  # each node's two sessions: the check failed, the metric passed
        assert out.count(f"FAILED suites/{SUITE}::{FP32_ALLREDUCE}") == 2, out[-3000:] + err[-3000:]
        assert "ERROR" not in out and out.count("1 failed, 1 passed") == 2, out[-3000:]
    [report] = rp.find_runs(pytester.path / "out")  # one report, not one per rank or per node
    rows = rp.load(report).rows
    tags = [json.loads(t) for t in rows["tags"]]
    assert {t["rank"] for t in tags} == {0, 1, 2, 3} and {t["world_size"] for t in tags} == {4}
    assert {t["local_rank"] for t in tags} == {0, 1}
    bandwidth = rows[rows["metric"] == "allreduce.bus_bandwidth"]
    assert len(bandwidth) >= 4 and (bandwidth["value"].dropna() > 0).all()
    assert set(rows[rows["outcome"] == "fail"]["metric"]), "the fault's check recorded no failed row"


def test_killing_one_rank_of_two_nodes_ends_all_four_within_the_timeout_naming_it(pytester, tmp_path):
    """Rank 3 (node 1) is killed from outside mid-launch: its node's torchrun names it; the ranks
    of node 0 wait for it no longer than the launch's timeout, then end naming it."""
    timeout_s = 20
    pids = tmp_path / "pids"
    pids.mkdir()
    pytester.makepyfile(
        test_killed=f"""
from harness.domains.engines.ranks import ranks

def test_a_launch_whose_rank_is_killed():
    ranks.launch("faults.distributed:ranks_wait_to_be_killed", world=4, timeout_s={timeout_s}, pid_dir={str(pids)!r})
"""
    )
    inject(pytester, "", fixtures={})
    nodes = _two_nodes(pytester)
    try:
        deadline = time.monotonic() + 180
        while len(list(pids.glob("*.pid"))) < 4:
            assert time.monotonic() < deadline and all(p.poll() is None for p in nodes), "the world did not start"
            time.sleep(0.2)
        os.kill(int((pids / "rank3.pid").read_text()), signal.SIGKILL)
        killed = time.monotonic()
    finally:
        finished = _finish(nodes, timeout=timeout_s + 90)
    took = time.monotonic() - killed
    (rc0, _, err0), (rc1, _, err1) = finished
    assert rc0 != 0 and rc1 != 0 and took < timeout_s + W.HUNG_RANK_GRACE_S + 30, (took, err0[-2000:], err1[-2000:])
    assert "rank      : 3" in err1 and "SIGKILL" in err1, err1[-3000:]  # node 1's torchrun names it
    # node 0's ranks name every rank that never arrived: 3, and any peer still held in a collective
    # waiting on 3: which peers gloo's barrier leaves waiting, rather than failing at once, varies
    # from run to run (seen: [3], [2, 3], [1, 3])
    named = re.search(r"rank\(s\) \[([0-9, ]+)\] of the launched world did not finish within 20 s", err0)
    assert named, err0[-3000:]
    missing = {int(r) for r in named.group(1).split(",")}
    assert 3 in missing, (missing, err0[-3000:])
    assert f"exitcode  : {W.BROKEN_WORLD_EXIT}" in err0


def test_a_hung_rank_is_named_by_its_peer_within_the_timeout(pytester):
    pytester.makepyfile(
        test_hangs="""
from harness.domains.engines.ranks import ranks

def test_a_launch_whose_rank_hangs():
    ranks.launch("faults.distributed:rank_hangs", world=2, timeout_s=10)
"""
    )
    inject(pytester, "", fixtures={})
    start = time.monotonic()
    run = _torchrun(pytester, timeout=200)
    took = time.monotonic() - start
    assert run.returncode != 0 and took < 10 + W.HUNG_RANK_GRACE_S + 40, (took, run.stderr[-2000:])
    assert "rank(s) [1] of the launched world did not finish within 10 s" in run.stderr, run.stderr[-3000:]


def test_ranks_that_all_hang_end_by_their_own_watchdogs(pytester):
    """No peer is left to name anyone: each rank's watchdog ends it past the timeout, its stack on stderr."""
    pytester.makepyfile(
        test_all_hang="""
from harness.domains.engines.ranks import ranks

def test_a_launch_whose_ranks_all_hang():
    ranks.launch("faults.distributed:every_rank_hangs", world=2, timeout_s=5)
"""
    )
    inject(pytester, "", fixtures={})
    start = time.monotonic()
    run = _torchrun(pytester, timeout=200)
    took = time.monotonic() - start
    assert run.returncode != 0 and took < 5 + W.HUNG_RANK_GRACE_S + 40, (took, run.stderr[-2000:])
    assert "of the launched world did not finish within 15 s (hung)" in run.stderr, run.stderr[-3000:]
    assert "every_rank_hangs" in run.stderr  # where it hung
