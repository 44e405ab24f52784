"""A failed parity check keeps its whole run as a script that trains what the harness trained.

The script's trainer is source text beside :func:`harness.domains.engines.training.loop.train`, so it
is held to it here: for each recipe feature the suite's recipes use (micro-batches, clipping after
unscaling, a loss factor, a static loss scale, micro-batch gradients summed in fp32 or bf16
buffers), the script's evaluation losses equal
the loop's bit for bit, for the run under test and for its fp32 reference, and its exit status is
the check's verdict. The control is a recipe fault the suite itself names: fp16 gradient buffers
(the source text's pitfall) fail parity and their script exits 1, where the fp32-buffer twin, the
same run otherwise, exits 0.

A failed AMP lane keeps its judged steps as a script: from each kept state, the next step taken by
the recipe, in float64 and correctly rounded in float64 (source text beside
:func:`harness.domains.engines.training.loop.step_from` and the emulation), so it is held to the lane the
same way: each state's two errors equal the lane's bit for bit, and the exit status is its verdict;
fp16 gradient buffers fail the lane too, and their script exits 1.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from harness.domains import repro as FR
from harness.domains.engines import training as T
from harness.domains.engines.training import amp_lane as L
from harness.domains.training import repro as training_repro


@pytest.fixture(scope="module")
def mlp_band():
    """The MLP's fp32 seed band, as the suite measures it (the check's allowance)."""
    setup = T.SETUPS["mlp"]
    runs = [T.train(setup, T.FP32, s) for s in range(T.DEFAULT_SEEDS)]
    return runs, T.seed_band(runs)


def _script(repro: FR.FailureRepro, where: Path) -> Path:
    """The script ``amp-harness repro`` writes for ``repro``, with its inputs file beside it."""
    spec = repro.spec("inputs.pt")
    (where / "inputs.pt").write_bytes(repro.tensor_bytes())
    script = where / "run.py"
    script.write_text(FR.render(spec, dict(repro.tensors), ["a whole-run script"], "inputs.pt"), encoding="utf-8")
    return script


def _run_in_process(script: Path) -> tuple[int, dict[str, object]]:
    """The script's exit status and its globals (its runs' evaluation losses): run here, not in a
    fresh interpreter, to compare its numbers with the loop's exactly (the scripts' standing alone
    is proven by tests/test_failure_repro.py)."""
    names: dict[str, object] = {"__file__": str(script), "__name__": "__main__"}
    try:
        exec(compile(script.read_text(encoding="utf-8"), str(script), "exec"), names)
    except SystemExit as exit:
        return int(exit.code or 0), names
    return 0, names


@pytest.mark.parametrize(
    "recipe",
    [T.ACCUM4, T.CLIP, T.FP16_WITH_SCALER_SMALL, T.FP16_STATIC_FP32_ACCUM, T.BF16_GRAD_ACCUM],
    ids=lambda r: r.metric_id,
)
def test_the_whole_run_script_trains_exactly_what_the_loop_trains(recipe, mlp_band, tmp_path):
    setup = T.SETUPS["mlp"]
    fp32_runs, band = mlp_band
    (result,) = T.check_parity(setup, [recipe], fp32_runs=fp32_runs).results
    repro = training_repro.repro_of(setup, recipe, band, torch.device("cpu"))
    assert repro is not None, training_repro.unsupported(setup, recipe)
    code, names = _run_in_process(_script(repro, tmp_path))
    assert names["run"] == result.run.eval_losses
    assert names["fp32"] == result.reference.eval_losses
    assert code == (0 if result.parity.passed else 1), result.parity


def test_fp16_gradient_buffers_fail_parity_and_their_script_exits_1(mlp_band, tmp_path):
    setup = T.SETUPS["mlp"]
    fp32_runs, band = mlp_band
    faulty = dataclasses.replace(T.FP16_GRAD_ACCUM, control=False)  # judged as a recipe, not a control
    (result,) = T.check_parity(setup, [faulty], fp32_runs=fp32_runs).results
    assert not result.parity.passed, result.parity
    repro = training_repro.repro_of(setup, faulty, band, torch.device("cpu"))
    assert repro is not None
    code, names = _run_in_process(_script(repro, tmp_path))
    assert names["run"] == result.run.eval_losses
    assert code == 1
    assert "STATIC = 16777216.0" in repro.code
    assert "ACCUM = torch.float16" in repro.code


def test_a_run_the_script_cannot_carry_says_why():
    setup = T.SETUPS["mlp"]
    emulated = dataclasses.replace(T.BF16, name="emulated", emulate=torch.bfloat16)
    assert "emulation" in str(training_repro.unsupported(setup, emulated))
    assert training_repro.unsupported(setup, T.FP16_STATIC_FP32_ACCUM) is None


def _lane_and_script(
    setup_name: str, recipe: T.Recipe, where: Path, states: int
) -> tuple[L.AmpLane, int, dict[str, object]]:
    """The lane from the first ``states`` checkpoints of a run of ``recipe``, and its script run here."""
    setup = T.SETUPS[setup_name]
    run = T.train(setup, recipe, keep_states_at=frozenset(sorted(L.lane_steps(setup))[:states]))
    lane, _ = L.check_lane(setup, recipe, run)
    repro = training_repro.lane_repro_of(setup, recipe, run, [e.step for e in lane.errors], torch.device("cpu"))
    assert repro is not None, training_repro.unsupported(setup, recipe)
    code, names = _run_in_process(_script(repro, where))
    return lane, code, names


@pytest.mark.parametrize(
    "case",
    [
        ("mlp", T.BF16),
        ("mlp", T.FP16_SCALER),  # the correctly rounded fp16 step's loss scale, chosen and backed off
        ("mlp", T.ACCUM4),
        ("mlp", T.CLIP),
        ("mlp", T.FP16_STATIC_FP32_ACCUM),
        # attention: autocast's correctly rounded, and the emulation's; AdamW (where bf16 is emulated
        # the LM's step costs 4-5 s: thorough there, as its parity is)
        pytest.param(("tiny_lm", T.BF16), marks=pytest.mark.amp_thorough_where_emulated("bf16")),
        ("cnn_bn", T.FP16_SCALER),  # batch statistics in training mode, BatchNorm's buffers
    ],
    ids=lambda c: f"{c[0]}-{c[1].metric_id}",
)
def test_the_lane_script_takes_exactly_the_steps_the_lane_takes(case, tmp_path):
    lane, code, names = _lane_and_script(*case, tmp_path, states=2)
    assert lane.errors
    assert names["ERRORS"] == {e.step: (e.amp, e.emulated) for e in lane.errors}
    assert code == (0 if L.judge_lane(lane).passed else 1)


def test_fp16_gradient_buffers_fail_the_lane_and_its_script_exits_1(tmp_path):
    faulty = dataclasses.replace(T.FP16_GRAD_ACCUM, control=False)  # judged as a recipe, not a control
    lane, code, names = _lane_and_script("mlp", faulty, tmp_path, states=2)
    assert not L.judge_lane(lane).passed
    assert names["ERRORS"] == {e.step: (e.amp, e.emulated) for e in lane.errors}
    assert code == 1
