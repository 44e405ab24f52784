"""Negative controls for the distributed suite, and the launcher's robustness."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import TESTS, assert_caught, fresh_driver, inject, run_inner

from harness.apps.cli import main
from harness.domains.engines.ranks import ranks as dist_h

SUITE = "distributed/test_mixed_precision_distributed.py"
_TORCH_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks.default_hooks"


def _override(pytester, fixture: str, value: object) -> None:
    inject(pytester, "distributed", fixtures={fixture: repr(value)})


def _report(pytester) -> str:
    return f"--amp-report-dir={pytester.path / 'out'}"


@pytest.fixture(scope="module")
def distributed_scripts() -> dict[Path, tuple[str, str]]:
    """Each control's scripts, with the edit that stands for the fix (the faulty implementation's
    line -> torch's own): written by the controls, run by the thorough test at the end."""
    return {}


def _keep_scripts(pytester, capsys, scripts, fix: tuple[str, str], count: int) -> None:
    """``repro --report`` of the control's run writes ``count`` scripts, one for every failed
    check (exit 0); each stands alone and names the faulty implementation once."""
    out = pytester.path / "repro"
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(out)]) == 0, capsys.readouterr()
    written = sorted(out.glob("*.py"))
    assert len(written) == count, capsys.readouterr()
    for path in written:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "harness" not in imported and text.count(fix[0]) == 1, text
        scripts[path] = fix


@pytest.mark.parametrize(
    ("hook", "message"),
    [
        ("compress_hook_without_division", "*DDP fp16 compression, tensor *: FAILED: mismatched elements*"),
        ("compress_hook_losing_mantissa", "*DDP fp16 compression, tensor *: FAILED: mismatched elements*"),
    ],
)
def test_a_broken_compression_hook_fails(pytester, suite_copy, hook, message, capsys, distributed_scripts):
    suite_copy(SUITE, conftest=False)
    _override(pytester, "ddp_hook", {"fp16": f"faults.distributed:{hook}", "bf16": f"faults.distributed:{hook}"})
    run = run_inner(pytester, "-k", "compressed and fp16", _report(pytester))
    assert_caught(run, "*::test_ddp_compressed_gradients_stay_within_the_format_budget_of_plain_allreduce[[]fp16]")
    run.stdout.fnmatch_lines([message], consecutive=False)
    fix = (f"HOOK = 'faults.distributed:{hook}'", f"HOOK = '{_TORCH_HOOKS}:fp16_compress_hook'")
    _keep_scripts(pytester, capsys, distributed_scripts, fix, 1)


def test_a_lossy_ddp_communication_path_fails_the_single_process_fp32_reference(
    pytester, suite_copy, capsys, distributed_scripts
):
    """DDP's "plain" all-reduce replaced by one that rounds through bf16: the check that holds DDP's
    averaged gradients to the single-process fp32 computation fails (the compression checks, which
    compare DDP with DDP, could not see it)."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "ddp_plain_hook", "faults.distributed:compress_hook_losing_mantissa")
    run = run_inner(pytester, "-k", "fp32_allreduce", _report(pytester))
    assert_caught(run, "*::test_ddp_fp32_allreduce_averages_gradients_within_the_fp32_budget_of_one_process")
    run.stdout.fnmatch_lines(["*DDP fp32 all-reduce, tensor *: FAILED: mismatched elements*"], consecutive=False)
    fix = ("PLAIN_HOOK = 'faults.distributed:compress_hook_losing_mantissa'", "PLAIN_HOOK = None")
    _keep_scripts(pytester, capsys, distributed_scripts, fix, 1)


def test_a_hook_that_does_not_send_its_declared_dtype_fails_the_declared_vs_observed_row(pytester, suite_copy):
    """A "compression" hook that sends fp32: its gradients are exact, so only the row that holds
    the all-reduce's dtype to the declared fp16 can see it."""
    suite_copy(SUITE, conftest=False)
    hook = "faults.distributed:uncompressed_hook"
    _override(pytester, "ddp_hook", {"fp16": hook, "bf16": hook})
    run = run_inner(pytester, "-k", "compressed and fp16")
    assert_caught(run, "*::test_ddp_compressed_gradients_stay_within_the_format_budget_of_plain_allreduce[[]fp16]")
    run.stdout.fnmatch_lines(
        ["*ddp.fp16_compression.declared_vs_observed.all_reduce: FAILED*", "*rank 0: all_reduce call 0: float32*"],
        consecutive=False,
    )
    failed = [r for r in run.rows if r["outcome"] == "fail"]
    assert [r["metric"] for r in failed] == ["ddp.fp16_compression.declared_vs_observed.all_reduce"], failed


@pytest.mark.parametrize("hook", ["local_gradients_only_hook", "compress_hook_without_division"])
def test_a_ddp_path_that_changes_the_gradient_fails_the_one_process_amp_reference(
    pytester, suite_copy, hook, capsys, distributed_scripts
):
    """DDP + AMP against one process: ranks that never communicate (each steps on its half-batch)
    or a hook that forgets to divide by the world size leave the first step's gradient budget."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "ddp_amp_hook", f"faults.distributed:{hook}")
    run = run_inner(pytester, "-k", "matches_one_process", _report(pytester))
    assert_caught(run, "*::test_ddp_autocast_gradscaler_training_matches_one_process")
    run.stdout.fnmatch_lines(["*first step's gradients, rank 0: FAILED*"], consecutive=False)
    _keep_scripts(pytester, capsys, distributed_scripts, (f"HOOK = 'faults.distributed:{hook}'", "HOOK = None"), 1)


FSDP2_POLICY = "*::test_fsdp2_does_what_its_mixed_precision_policy_declares"
FSDP2_REDUCE = "*::test_fsdp2_fp32_reduce_meets_the_fp32_budget_and_bf16_reduce_does_not"


@pytest.mark.parametrize(
    ("fault", "caught", "message", "scripts"),
    [
        (  # scripts: the policy's reduce-scatter row and the fp32 reduce's budget
            "fully_shard_ignoring_reduce_dtype",
            (FSDP2_POLICY, FSDP2_REDUCE),
            "*fsdp2.reduce_float32.declared_vs_observed.reduce_dtype.reduce_scatter: FAILED*",
            2,
        ),
        (  # scripts: the output row under each reduce dtype
            "fully_shard_ignoring_output_dtype",
            (FSDP2_POLICY,),
            "*fsdp2.reduce_float32.declared_vs_observed.output_dtype: FAILED*",
            2,
        ),
    ],
)
def test_an_ignored_fsdp2_policy_field_fails_naming_it(
    pytester, suite_copy, fault, caught, message, scripts, capsys, distributed_scripts
):
    """FSDP2 dropping one declared field: the declared-vs-observed check names the field, the rank
    and what was carried; a dropped reduce dtype also fails the reduce's fp32 budget. Each failed
    row keeps its script."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "fsdp2_shard", f"faults.distributed:{fault}")
    run = run_inner(pytester, "-k", "fsdp2", _report(pytester))
    assert_caught(run, *caught)
    run.stdout.fnmatch_lines([message, "*rank 0: *bfloat16*"], consecutive=False)
    fix = (f"SHARD = 'faults.distributed:{fault}'", "SHARD = 'torch.distributed.fsdp:fully_shard'")
    _keep_scripts(pytester, capsys, distributed_scripts, fix, scripts)


def test_a_lossy_reduce_that_carries_the_declared_dtype_fails_the_reduce_budgets(
    pytester, suite_copy, capsys, distributed_scripts
):
    """A reduce-scatter that rounds through fp8 while carrying the declared dtypes: the policy rows
    pass (nothing was mislabelled) and both reduces miss their own dtype's budget."""
    suite_copy(SUITE, conftest=False)
    _override(pytester, "fsdp2_shard", "faults.distributed:fully_shard_with_lossy_reduce_scatter")
    run = run_inner(pytester, "-k", "fsdp2", _report(pytester))
    assert_caught(run, FSDP2_REDUCE)
    run.stdout.fnmatch_lines(["*FSDP2 reduce float32, tensor *: FAILED*"], consecutive=False)
    failed = {r["metric"].split(",")[0] for r in run.rows if r["outcome"] == "fail"}
    assert failed == {
        "FSDP2 reduce float32",
        "FSDP2 reduce bfloat16 within its own budget",
        "fsdp2.bf16_reduce_exceeds_the_fp32_budget",
    }, failed
    # a script per reduce dtype (its first failed tensor); the test's other failed rows are covered by them
    fix = (
        "SHARD = 'faults.distributed:fully_shard_with_lossy_reduce_scatter'",
        "SHARD = 'torch.distributed.fsdp:fully_shard'",
    )
    _keep_scripts(pytester, capsys, distributed_scripts, fix, 2)


def test_a_sharded_scaler_that_does_not_share_its_inf_flag_fails(pytester, suite_copy, capsys, distributed_scripts):
    suite_copy(SUITE, conftest=False)
    _override(pytester, "sharded_scaler", "faults.distributed:LocalInfScaler")
    run = run_inner(pytester, "-k", "every_rank_skip", _report(pytester))
    assert_caught(run, "*::test_an_inf_on_any_one_rank_makes_every_rank_skip_with_the_same_scale")
    run.stdout.fnmatch_lines(
        ["*inf only on rank 0: ranks [[]1[]] stepped anyway*", "*inf only on rank 1: ranks [[]0[]] stepped anyway*"],
        consecutive=False,
    )
    # one script (the first failed claim's: it runs every case and covers the test's other failed claims)
    fix = (
        "SCALER = 'faults.distributed:LocalInfScaler'",
        "SCALER = 'torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler'",
    )
    _keep_scripts(pytester, capsys, distributed_scripts, fix, 1)


#: the controls above whose scripts the next test runs (a script per failed row)
SCRIPTED = 2 + 1 + 2 + 2 + 1 + 2 + 2


@pytest.mark.amp_thorough
def test_each_distributed_script_exits_1_with_the_fault_and_0_with_torchs_own(distributed_scripts, tmp_path):
    """Each control's script, its ranks forked from a fresh interpreter that cannot import the
    harness (``faults`` importable: the faulty implementation is named in it): exit 1 as written,
    0 with torch's own implementation in the faulty one's place (the edit standing for the fix).
    Thorough tier: 24 scripts (12 and their fixes) of two gloo ranks each (DDP or FSDP2), in an interpreter of its own, about 60 s on 2 cores."""
    if len(distributed_scripts) < SCRIPTED:
        pytest.skip("the scripts are written by the controls above (file order): run them first")
    fixed = []
    for path, (old, new) in distributed_scripts.items():
        copy = tmp_path / f"fixed_{len(fixed)}_{path.name}"
        copy.write_text(path.read_text(encoding="utf-8").replace(old, new), encoding="utf-8")
        fixed.append(copy)
    # one interpreter per script, as a user runs it: a script's ranks fork from it, and a fork after
    # another script's parallel region in the same interpreter can hang in the OpenMP runtime
    driver = fresh_driver(f"sys.path.insert(0, {str(TESTS)!r})")
    codes, said = {}, ""
    paths = [*distributed_scripts, *fixed]
    for pair in (paths[i : i + 2] for i in range(0, len(paths), 2)):  # two at a time: two cores
        procs = [
            subprocess.Popen(
                [sys.executable, "-I", "-c", driver, str(path)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for path in pair
        ]
        for proc in procs:
            got, text = _codes(proc)
            codes.update(got)
            said += text
    assert [codes[str(p)] for p in distributed_scripts] == [1] * len(distributed_scripts), said[-4000:]
    assert [codes[str(p)] for p in fixed] == [0] * len(fixed), said[-4000:]


def _codes(proc: subprocess.Popen[str]) -> tuple[dict[str, int], str]:
    stdout, stderr = proc.communicate(timeout=300)
    line = next((x for x in stdout.splitlines() if x.startswith("CODES ")), None)
    assert line is not None, stdout[-3000:] + stderr[-3000:]
    return json.loads(line.removeprefix("CODES ")), stdout + stderr


def test_a_crashing_rank_surfaces_its_traceback():
    with pytest.raises(dist_h.RankError, match=r"(?s)rank 1 failed:\n.*ValueError: rank 1 broke on purpose"):
        dist_h.launch("faults.distributed:rank_crashes", world=2, timeout_s=60)


def test_a_hung_rank_is_killed_at_the_timeout():
    start = time.monotonic()
    # rank 0 returns at once; on a first launch it may still be starting when the timeout hits
    with pytest.raises(dist_h.RankError, match=r"rank\(s\) \[(0, )?1\] did not finish within 1 s"):
        dist_h.launch("faults.distributed:rank_hangs", world=2, timeout_s=1)
    assert time.monotonic() - start < 30


#: the bandwidth check: a timing, so in the speed suite, run on the ranks engine
INTERCONNECT = "speed/test_interconnect.py"
BANDWIDTH = "test_allreduce_bus_bandwidth_meets_the_floor_calibrated_for_this_worlds_shape"


@pytest.mark.amp_timing  # calibrates and judges the loopback's bandwidth
def test_an_all_reduce_slowed_2x_fails_the_floor_this_class_calibrated(pytester, suite_copy, capsys):
    """``amp-harness calibrate --allreduce`` places this class's floors from real launches; the same
    check then fails on an all-reduce twice as slow, confirmed by a second launch. Where this host's
    loopback scatters too much to place a floor (as on 2 shared cores it mostly does), the class
    records the figure and never judges it: the control skips, saying so, and the rule's own test
    below shows every verdict it can reach."""
    from harness.storage import profiles

    base = pytester.path / "calibrated"
    assert main(["calibrate", "--allreduce", "--runs", "5", "--baseline-dir", str(base)]) == 0
    said = capsys.readouterr().out
    [path] = (base / profiles.DIR).glob("*.json")
    floors = json.loads(path.read_text())["thresholds"]
    judged = {k: v for k, v in floors.items() if k.startswith("allreduce_bus_bandwidth") and v["expect"] == "judge"}
    assert floors and all(k.startswith("allreduce_bus_bandwidth_gloo_2ranks_1hosts/") for k in floors), floors
    if not judged:
        pytest.skip(f"this host's loopback all-reduce scatters beyond a judged floor: {said}")
    suite_copy(INTERCONNECT, conftest=False)
    inject(pytester, "speed", fixtures={"allreduce_timed": repr("faults.speed:all_reduce_slowed")})
    run = run_inner(pytester, "-k", "bandwidth", f"--amp-baseline-dir={base}", "--amp-report-dir=out")
    assert_caught(run, f"*::{BANDWIDTH}")
    failed = {r["dtype"] for r in run.rows if r["outcome"] == "fail" and r["metric"] == "allreduce.bus_bandwidth"}
    assert failed == {k.split("/")[1] for k in judged}, (failed, judged)


def test_the_floor_rule_passes_confirms_a_failure_and_calls_an_unconfirmed_one_noisy():
    """The decision itself, on measurements given to it: a floor from five calibration values
    within the scatter limit; a value at the median passes, one under the floor fails only when the
    second measurement is under it too, and no floor (or a scattered calibration) judges nothing."""
    from harness.domains.speed import interconnect as I
    from harness.numerics.verdict import Outcome

    floor = I.floor_from_calibration([1.0, 1.02, 0.98, 1.05, 0.97])
    assert floor.judged and floor.min_speedup is not None and 0.87 < floor.min_speedup < 0.88  # 1 / sqrt(1.3)
    never = lambda: pytest.fail("a passing value is not measured again")  # noqa: E731
    assert I.judge(1.0, floor, never, "cal").outcome is Outcome.PASS
    slowed = 1.0 / 1.3  # the slowdown the floor is placed to catch
    assert I.judge(slowed, floor, lambda: slowed, "cal").outcome is Outcome.FAIL
    assert I.judge(slowed, floor, lambda: 1.0, "cal").outcome is Outcome.NOISY
    assert I.judge(slowed, None, never, "cal --x").outcome is Outcome.UNJUDGED
    scattered = I.floor_from_calibration([1.0, 1.3, 0.8, 1.0, 1.0])
    # calibrated, but too scattered for a floor: the host's noise (NOISY), not a calibration still
    # to make (NOT JUDGED would ask for the one just made)
    noisy = I.judge(slowed, scattered, never, "cal")
    assert not scattered.judged and noisy.outcome is Outcome.NOISY and "too noisy" in noisy.note
