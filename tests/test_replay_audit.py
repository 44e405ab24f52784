"""A data-parallel job audits its own cards through the public API (``harness.api.ReplayAudit``): on
audit steps each rank replays its neighbour's micro-batch and compares the gradients bitwise. Shown
by fault injection on real gloo ranks running a user's DDP training in bf16 autocast with dropout:
a clean job agrees on every audit step; a rank with a stuck lane in its bf16 GEMM unit, or an
intermittent bit flip, is named by its ring neighbours (three ranks) or left undecided between two
(two ranks, saying what decides); a rank whose parameters drift is named by the parameters' majority;
a step that is not reproducible is not judged. The rule itself (:func:`judge`) is checked on digests."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import REPO

from harness.api import AuditLog, AuditVerdict, ReplayAudit, load_audit_log
from harness.domains.engines.ranks.ranks import launch
from harness.domains.known_answers.replay import AuditResult, RankDigests, judge

PROGRAM = "faults.known_answers:audited_ddp_scenarios"

# -- the rule, on digests ------------------------------------------------------------------------


def _ranks(
    world: int, *, wrong: frozenset[int] = frozenset(), flaky: int | None = None, params: dict[int, str] | None = None
):
    """Digests of ``world`` ranks: a rank in ``wrong`` computes every micro-batch wrongly (its own,
    and the one it replays); ``flaky`` gets its own micro-batch wrong once (its first computation)."""
    params = params or {}
    out = []
    for r in range(world):
        own = {"w": f"b{r}" + ("!" if r in wrong or r == flaky else "")}
        again = {"w": f"b{r}" + ("!" if r in wrong else "")}
        prev = (r - 1) % world
        replay = {"w": f"b{prev}" + ("!" if r in wrong else "")}
        out.append(RankDigests(r, params.get(r, "p"), own, again, replay))
    return out


def test_the_rule_agrees_when_every_replay_gives_the_owners_bits():
    assert judge(0, _ranks(4)).verdict is AuditVerdict.AGREE


def test_the_rule_names_a_persistently_wrong_rank_by_both_its_ring_neighbours():
    result = judge(3, _ranks(4, wrong=frozenset({2})))
    assert (result.verdict, result.suspects) == (AuditVerdict.SUSPECT, (2,))
    assert {d.ranks for d in result.replay_mismatches} == {(1, 2), (2, 3)}


def test_the_rule_with_two_ranks_cannot_tell_which_is_wrong_and_says_what_decides():
    result = judge(0, _ranks(2, wrong=frozenset({1})))
    assert (result.verdict, result.suspects) == (AuditVerdict.UNDECIDED, (0, 1))
    assert "amp-harness audit" in result.advice and result.exit_code == 1


def test_the_rule_names_a_rank_that_disagrees_with_itself():
    result = judge(0, _ranks(2, flaky=0))
    assert (result.verdict, result.suspects) == (AuditVerdict.SUSPECT, (0,))


def test_the_rule_judges_nothing_when_every_rank_disagrees_with_itself():
    ranks = [RankDigests(r, "p", {"w": "a"}, {"w": "b"}, {"w": "a"}) for r in range(3)]
    result = judge(0, ranks)
    assert (result.verdict, result.exit_code) == (AuditVerdict.UNREPRODUCIBLE, 3)
    assert "use_deterministic_algorithms" in result.advice


def test_the_rule_names_the_ranks_whose_parameters_left_the_majority():
    result = judge(0, _ranks(3, params={1: "q"}))
    assert (result.verdict, result.suspects, result.diverged) == (AuditVerdict.DIVERGED, (1,), (1,))
    tie = judge(0, _ranks(2, params={1: "q"}))
    assert (tie.verdict, tie.suspects, tie.diverged) == (AuditVerdict.DIVERGED, (), (0, 1))


def test_one_rank_is_refused_and_so_is_a_nonsense_period():
    with pytest.raises(ValueError, match="two or more ranks"):
        judge(0, _ranks(1))
    for every in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="positive number of steps"):
            ReplayAudit(lambda m, b: m(b).sum(), every=every)  # type: ignore[arg-type]


# -- on real ranks, with faults injected -----------------------------------------------------------


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> dict[str, list[dict]]:
    """Every three-rank scenario in one launch (rank 0's results; every rank's are compared)."""
    log = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    names = ("clean", "stuck_lane", "intermittent", "drift", "nondeterministic")
    scenarios = [
        {"log": str(log)}, {"fault": "stuck_lane"}, {"fault": "intermittent"}, {"drift_rank": 2},
        {"nondeterministic": True},
    ]  # fmt: skip
    results = launch(PROGRAM, world=3, scenarios=scenarios)
    assert results[0] == results[1] == results[2], "every rank must reach the same verdicts"
    return {"log": [{"path": str(log)}], **dict(zip(names, results[0], strict=True))}


def _verdicts(audits: list[dict]) -> list[tuple[int, str, list[int]]]:
    return [(a["step"], a["verdict"], a["suspects"]) for a in audits]


def test_a_clean_job_agrees_on_every_audit_step_and_logs_each(three_ranks):
    assert _verdicts(three_ranks["clean"]) == [(0, "agree", []), (2, "agree", [])]
    frame = load_audit_log(three_ranks["log"][0]["path"])
    assert list(frame["step"]) == [0, 2] and frame["passed"].all(), "rank 0 alone writes one line per audit step"


def test_a_rank_with_a_stuck_lane_is_named_by_its_neighbours_with_the_first_differing_bits(three_ranks):
    audits = three_ranks["stuck_lane"]
    assert _verdicts(audits) == [(0, "suspect", [1]), (2, "suspect", [1])]
    first = audits[0]["replay_mismatches"][0]
    assert first["where"]["count"] > 0 and first["where"]["expected_bits"] != first["where"]["observed_bits"]


def test_an_intermittent_bit_flip_is_caught_and_its_rank_named(three_ranks):
    audits = three_ranks["intermittent"]
    assert any(a["verdict"] == "suspect" and a["suspects"] == [1] for a in audits), _verdicts(audits)
    assert all(a["suspects"] in ([], [1]) for a in audits), "no healthy rank is ever named"


def test_a_rank_whose_parameters_drift_is_named_by_the_majority(three_ranks):
    assert _verdicts(three_ranks["drift"]) == [(0, "agree", []), (2, "diverged", [2])]


def test_a_step_that_cannot_be_replayed_is_not_judged(three_ranks):
    assert {a["verdict"] for a in three_ranks["nondeterministic"]} == {"unreproducible"}


def test_with_two_ranks_a_stuck_lane_is_caught_and_left_undecided_between_them():
    audits = launch(PROGRAM, world=2, scenarios=[{"fault": "stuck_lane", "steps": 1}])[0][0]
    assert _verdicts(audits) == [(0, "undecided", [0, 1])]
    assert (
        "amp-harness audit" in AuditResult(0, 2, AuditVerdict.UNDECIDED, (0, 1), advice=audits[0]["advice"]).describe()
    )


def test_the_log_keeps_what_was_recorded_when_the_job_died_writing(tmp_path):
    log = tmp_path / "audit.jsonl"
    AuditLog(log)(AuditResult(0, 2, AuditVerdict.AGREE, ()))
    with log.open("a", encoding="utf-8") as f:
        f.write('{"step": 1, "wor')  # the job died mid-line
    assert list(load_audit_log(log)["step"]) == [0]
    log.write_text('not json\n{"step": 0}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"audit.jsonl:1: not an audit record"):
        load_audit_log(log)


# -- as a user runs it: torchrun, the audit raising on every rank --------------------------------

USER_SCRIPT = """
import os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from harness.api import AuditLog, ReplayAudit, ReplayAuditFailed

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.set_num_threads(1)
if len(sys.argv) > 1 and rank == 1:
    sys.path.insert(0, sys.argv[1])
    from faults.known_answers import register_bf16_gemm_stuck_lane
    card = register_bf16_gemm_stuck_lane()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.AdamW(model.parameters())

def loss_of(m, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.nn.functional.cross_entropy(m(batch["x"]).float(), batch["y"])

audit = ReplayAudit(loss_of, every=2, record=AuditLog("audit.jsonl"))
try:
    for step in range(4):
        g = torch.Generator().manual_seed(10 * step + rank)
        batch = {"x": torch.randn(8, 32, generator=g), "y": torch.randint(0, 4, (8,), generator=g)}
        audit(step, model, batch)
        opt.zero_grad()
        loss_of(model, batch).backward()
        opt.step()
except ReplayAuditFailed as failed:
    print(f"rank {rank}: {failed}", flush=True)
    code = failed.result.exit_code
else:
    code = 0
# every rank raised alike; gloo can abort a process whose threads are torn down at interpreter exit
# (torch 2.13: 2 of 14 torchrun exits without the barrier, 1 of 12 with it): leave without that teardown
dist.barrier()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(code)
"""


@pytest.mark.amp_thorough  # three fresh interpreters importing torch twice: about 20 s on 2 cores
@pytest.mark.as_users_run_it
def test_under_torchrun_a_users_job_stops_on_every_rank_naming_the_faulty_one(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(USER_SCRIPT), encoding="utf-8")

    def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3", str(script), *args]
        return subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)

    clean = torchrun()
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert [json.loads(line)["verdict"] for line in (tmp_path / "audit.jsonl").read_text().splitlines()] == [
        "agree"
    ] * 2
    faulty = torchrun(str(Path(REPO) / "tests"))
    assert faulty.returncode != 0
    for rank in range(3):
        assert f"rank {rank}: replay audit, step 0, 3 ranks: SUSPECT, rank(s) 1" in faulty.stdout, faulty.stdout
