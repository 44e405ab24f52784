"""Claim family: compiled AMP is as accurate as eager AMP, judged against float64.

Compiled and eager AMP round in different places (Inductor keeps fused intermediates in fp32, or
rounds a product before adding its bias). At every stage and gradient of the probe block the
compiled error against a float64 run must stay within eager's error plus the budget of one
low-precision rounding per op boundary, each propagated through the block in float64
(``harness/domains/compiled/budget.py``: derived from the format's unit roundoff, not tuned).

With Inductor's ``emulate_precision_casts`` (keep eager's roundings) the same rule holds, and the
stages where the switch changes the compiled result are the ones Inductor computes at higher
precision than eager: recorded per stage (known issue ``inductor-elides-eager-roundings``).

The rule's error rates (thorough tier): no clean compile fails over 12 initialisations and inputs,
and a compiler adding one rounding to one significand bit fewer than the format has, at every GEMM
output, fails in every seed (``harness/domains/compiled/rates.py``).
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.compiled import budget, rates, runs
from harness.domains.compiled.probe import STAGE_NAMES
from harness.domains.compiled.repro import block_repro_of
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("compiled AMP")


def _judge(block_runs, dtype, variant):
    ref, bud = block_runs.reference(dtype)
    return budget.judge(
        variant.name, block_runs.eager(dtype), block_runs.compiled(dtype, variant).observation, ref, bud
    )


def _record_errors(amp_record, result, amp_device, amp_dtype):
    for k in result.compiled:
        amp_record(
            f"compiled.{result.variant}.{k}.error_vs_fp64",
            result.compiled[k],
            unit="relative",
            expected=result.eager[k],
            allowance=result.budget.allowance[k],
            dtype=amp_dtype,
            device=amp_device,
            note=f"eager {result.eager[k]:.3g}; budget on top {result.budget.allowance[k]:.3g} "
            f"(largest term: {result.budget.largest_term[k]})",
        )


#: fp16 on the CPU is thorough-tier: its own cold compile of the block (about 15 s on 2 cores) for a
#: path CPUs rarely train in; on CUDA, where fp16 is the classic AMP path, it stays in the default tier.
@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")
def test_compiled_amp_error_stays_within_eager_error_plus_the_rounding_budget(
    block_runs, amp_device, amp_dtype, amp_record
):
    result = _judge(block_runs, amp_dtype, runs.DEFAULT)
    _record_errors(amp_record, result, amp_device, amp_dtype)
    amp_record.require(
        result.claim(),
        dtype=amp_dtype,
        device=amp_device,
        tags={"worst": result.worst()},
        repro=block_repro_of(block_runs, amp_dtype, result),
    )


@pytest.mark.amp_thorough_dtypes("fp16")  # one more compile; bf16 shows the effect in the default tier
@pytest.mark.amp_thorough_on("cpu")  # on the CPU the emulated compile is ~8 s cold on 2 cores: thorough there
def test_emulated_precision_casts_stay_within_the_budget_and_show_where_inductor_keeps_higher_precision(
    block_runs, amp_device, amp_dtype, amp_record, inductor_only
):
    variant = runs.EMULATED_CASTS
    missing = variant.available()
    if missing:
        pytest.skip(f"{missing}: this stack offers no switch to emulate eager's precision casts")
    default = block_runs.compiled(amp_dtype).observation
    emulated = block_runs.compiled(amp_dtype, variant).observation
    eager = block_runs.eager(amp_dtype)
    for stage in STAGE_NAMES:
        changed = not torch.equal(default.outputs[stage], emulated.outputs[stage])
        amp_record(
            f"compiled.{stage}.computed_at_higher_precision_than_eager",
            changed,
            dtype=amp_dtype,
            device=amp_device,
            tags={
                "distance_to_eager_default": float(
                    (default.outputs[stage].double() - eager.outputs[stage].double()).abs().max()
                ),
                "distance_to_eager_emulated": float(
                    (emulated.outputs[stage].double() - eager.outputs[stage].double()).abs().max()
                ),
            },
            note="emulate_precision_casts changes this stage: by default Inductor elides a rounding eager does"
            if changed
            else "the same with and without emulate_precision_casts",
        )
    result = _judge(block_runs, amp_dtype, variant)
    _record_errors(amp_record, result, amp_device, amp_dtype)
    amp_record.require(
        result.claim(),
        dtype=amp_dtype,
        device=amp_device,
        tags={"worst": result.worst()},
        repro=block_repro_of(block_runs, amp_dtype, result, variant),
    )


#: Seeds (block initialisation and inputs) of the rate measurement, and the clean compiles that may
#: fail (none: measured 0 of 12 per dtype, worst 0.18 / 0.25 of the budget).
RATE_SEEDS, DETECTION_SEEDS = 12, 6
STATED_FALSE_ALARMS = 0
#: The rule is stated to catch, in every seed, a compiler that rounds every low-precision GEMM output
#: once more to one significand bit fewer than the format has (bf16 8 -> 7, fp16 11 -> 10): an
#: extra rounding of relative size 2^-7 / 2^-10, the format's own scale (measured: 6 of 6 each).
FORMAT_BITS = {torch.bfloat16: 8, torch.float16: 11}


@pytest.mark.amp_thorough  # 18 compiles per dtype (warm: about 15 s each dtype here)
def test_the_numerics_rule_has_its_stated_error_rates(amp_device, amp_dtype, compiler, amp_compile_backend, amp_record):
    clean = rates.false_alarms(amp_compile_backend, amp_device, amp_dtype, range(RATE_SEEDS))
    alarms = [r for r in clean if r.worst_ratio > 1.0]
    bits = FORMAT_BITS[amp_dtype]
    ladder = rates.detection(amp_device, amp_dtype, (bits, bits - 1), range(DETECTION_SEEDS))
    unchanged, one_bit = ladder[bits], ladder[bits - 1]
    caught = [r for r in one_bit if r.worst_ratio > 1.0]
    amp_record(
        "compiled.numerics_rule.false_alarm_rate",
        len(alarms) / len(clean),
        unit="share",
        dtype=amp_dtype,
        device=amp_device,
        tags={"worst_ratios": [round(r.worst_ratio, 3) for r in clean]},
        note=f"clean compiles failing the numerics rule, over {RATE_SEEDS} initialisations and inputs",
    )
    amp_record.require(
        compare_claim(
            "compiled.numerics_rule.error_rates",
            len(caught),
            len(alarms) <= STATED_FALSE_ALARMS
            and len(caught) == len(one_bit)
            and all(r.worst_ratio <= 1.0 for r in unchanged),
            f"no clean compile of {RATE_SEEDS} fails, and one extra rounding of every GEMM output to {bits - 1} "
            f"significand bits (the format has {bits}) fails in all {DETECTION_SEEDS} seeds (the same rounding at "
            f"{bits} bits, a no-op, passes)",
            detail=(
                f"clean: {len(alarms)} of {len(clean)} failed (worst ratios {[round(r.worst_ratio, 2) for r in clean]}); "
                f"extra rounding to {bits - 1} bits caught in {len(caught)} of {len(one_bit)} "
                f"(ratios {[round(r.worst_ratio, 2) for r in one_bit]}); at {bits} bits "
                f"{[round(r.worst_ratio, 2) for r in unchanged]}",
            ),
            expected=len(one_bit),
        ),
        dtype=amp_dtype,
        device=amp_device,
    )
