"""Claim family: compiled AMP trains like eager AMP, and like fp32.

The training suite's models and recipes, trained with the model compiled (forward and backward
through the backend under test, the optimizer and scaler eager): bf16 autocast, and fp16 with
GradScaler where one step's forward pass overflows inside the compiled graph (the first layer's
output multiplied by inf: ``harness.domains.engines.training.loop.overflow_gate``) and the scaler must skip
that step. Judged with the training
suite's statistics (``harness.domains.engines.training.parity``): the evaluation loss within half the fp32
seed band of the eager AMP run and of the fp32 run (skipped steps replayed), and the GradScaler's
state (scale before every step, skipped steps, final scale) identical to eager's.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest

from harness.domains.engines import training as T
from harness.domains.engines.training import whole_run
from harness.numerics.comparison import compare_claim, compare_data, explain

pytestmark = pytest.mark.amp_capability("compiled AMP")

CASES = [
    ("mlp", T.BF16),
    # fp16 + GradScaler compiled: a cold compile of its own (about 7 s on 2 cores); fp16 is rarely
    # trained on CPUs, so thorough there, default on CUDA
    pytest.param("mlp", T.FP16_SCALER, marks=pytest.mark.amp_thorough_on("cpu")),
    *(
        pytest.param(name, recipe, marks=pytest.mark.amp_thorough)
        for name in ("tiny_lm", "cnn_bn")
        for recipe in (T.BF16, T.FP16_SCALER, T.ACCUM4)
    ),
]


def _scaler_state(run: T.Run) -> dict[str, object]:
    return {"scales": run.scales, "skipped_at": run.skipped_at, "final_scale": run.final_scale}


@pytest.mark.parametrize(("setup_name", "recipe"), CASES, ids=lambda v: getattr(v, "name", v))
def test_compiled_training_matches_eager_amp_and_fp32_within_the_seed_spread(
    setup_name, recipe, amp_device, compiler, amp_compile_backend, amp_record
):
    setup = T.SETUPS[setup_name]
    # mid-run, once the scaler has settled: the skip is the injected overflow's, not calibration's
    overflow = frozenset({setup.steps // 2}) if recipe.scaler else frozenset()
    eager = T.train(setup, recipe, 0, amp_device, overflow_at=overflow)
    compiled = T.train(setup, recipe, 0, amp_device, overflow_at=overflow, compile=compiler)
    fp32 = [T.train(setup, T.FP32, s, amp_device) for s in range(T.DEFAULT_SEEDS)]
    band = T.seed_band(fp32)
    reference = T.reference_for(setup, recipe, compiled, fp32[0], amp_device)
    tags = {"setup": setup_name, "recipe": recipe.name, "skipped_at": compiled.skipped_at, "band_seeds": band.seeds}
    failures = []
    # a failed claim keeps the whole run as a script (written once, only when one fails)
    script = functools.cache(
        lambda: whole_run.repro_of(setup, recipe, band, amp_device, backend=amp_compile_backend, overflow=overflow)
    )
    if recipe.scaler:
        injected = sorted(overflow)
        if not set(injected) <= set(eager.skipped_at):
            amp_record.require(
                compare_claim(
                    f"compiled.{setup_name}.{recipe.metric_id}.injected_overflow_skipped",
                    False,
                    False,
                    "the injected overflow makes eager GradScaler skip its step (the precondition of the comparison)",
                    detail=f"eager skipped {eager.skipped_at}, injected at {injected}: the injection tested nothing",
                    inconclusive=True,
                ),
                device=amp_device,
                tags=tags,
            )
        state = compare_data(
            f"compiled {setup_name} / {recipe.name}: GradScaler state against eager",
            _scaler_state(eager),
            _scaler_state(compiled),
        )
        if not amp_record.result(
            state, dtype=recipe.dtype, device=amp_device, tags=tags, repro=None if state.passed else script()
        ):
            failures.append(state)
    for against, ref in (("eager", eager), ("fp32", reference)):
        named = replace(recipe, name=f"compiled {recipe.name} vs {against}")
        verdict = T.judge(setup_name, T.RecipeResult(named, compiled, ref, T.parity(compiled, ref, band)))
        if not amp_record.result(
            verdict, dtype=recipe.dtype, device=amp_device, tags=tags, repro=None if verdict.passed else script()
        ):
            failures.append(verdict)
    if failures:
        raise AssertionError("\n".join(explain(f) for f in failures))
