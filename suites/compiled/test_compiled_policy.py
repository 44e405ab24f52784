"""Claim family: torch.compile keeps autocast's dtype policy.

Autocast decides each op's dtype; under ``torch.compile`` the decision is traced into the graph
(AOTAutograd) and Inductor lowers it. The compiled block (linear -> layer_norm -> attention ->
projection -> gelu -> logits -> softmax, cross-entropy loss) must produce eager's dtype at every
stage and for every gradient. A region with autocast disabled inside an autocast forward must stay
fp32 in the compiled forward, and in the compiled backward too once the backward is traced outside
autocast, as eager runs it (torch 2.13's default traces it under the forward's autocast: known
issue ``compiled-backward-under-forward-autocast``, ``test_compiled_known_issues.py``). The thorough
tier compiles every op of the autocast catalogue on its own and compares its output dtype.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.compiled import catalogue, runs
from harness.domains.compiled.known_issues import BUILD_FAILURE, KNOWN_ISSUES, WHERE, build_failure_seen
from harness.domains.compiled.repro import block_dtypes_repro_of, ops_repro_of, region_repro_of
from harness.numerics.comparison import compare_data

pytestmark = pytest.mark.amp_capability("compiled AMP")


@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")  # as the numerics check: one cold compile of its own
def test_compiled_amp_has_eager_dtypes_at_every_stage_and_gradient(block_runs, amp_device, amp_dtype, amp_record):
    eager = block_runs.eager(amp_dtype)
    compiled = block_runs.compiled(amp_dtype)
    amp_record(
        "compiled.default.compile_s",
        compiled.compile_s,
        unit="s",
        dtype=amp_dtype,
        device=amp_device,
        note="first call of the compiled block (trace + compile + forward and backward); Inductor's cache may be warm",
    )
    amp_record.require(
        compare_data("compiled block dtypes (stage outputs, gradients)", eager.dtypes(), compiled.observation.dtypes()),
        dtype=amp_dtype,
        device=amp_device,
        repro=block_dtypes_repro_of(block_runs, amp_dtype),
    )


def test_the_blocks_build_failure_matches_the_registry(raw_block_runs, amp_device, amp_record):
    """Registry check of ``inductor-cpu-vectorizedn-fmadd-build-failure`` (torch 2.5's bf16 block
    that does not build), observed on the block's own bf16 compile, which this file makes anyway."""
    present, seen = build_failure_seen(lambda: raw_block_runs.compiled(torch.bfloat16))
    amp_record.require_registry(
        KNOWN_ISSUES[BUILD_FAILURE], present, f"{WHERE} ({BUILD_FAILURE!r})", seen=seen, device=amp_device
    )


@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")
def test_an_autocast_disabled_region_stays_fp32_in_the_compiled_forward(region_runs, amp_device, amp_dtype, amp_record):
    amp_record.require(
        region_runs.comparison(amp_dtype, runs.DEFAULT).claim("forward"),
        dtype=amp_dtype,
        device=amp_device,
        repro=region_repro_of(region_runs, amp_dtype, runs.DEFAULT, "forward"),
    )


@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")
def test_an_autocast_disabled_region_stays_fp32_in_the_compiled_backward_traced_outside_autocast(
    region_runs, amp_device, amp_dtype, amp_record
):
    variant = runs.BACKWARD_AUTOCAST_OFF
    missing = variant.available()
    if missing:
        pytest.skip(f"{missing}: the compiled backward cannot be traced outside autocast on this stack")
    amp_record.require(
        region_runs.comparison(amp_dtype, variant).claim("grad"),
        dtype=amp_dtype,
        device=amp_device,
        tags={"variant": variant.name, "functorch_config": dict(variant.functorch)},
        repro=region_repro_of(region_runs, amp_dtype, variant, "grad"),
    )


@pytest.mark.amp_thorough  # one compile per op: minutes on two cores
def test_every_catalogue_op_keeps_its_eager_dtype_when_compiled(
    amp_device, amp_dtype, compiler, amp_compile_backend, amp_record
):
    ops = catalogue.sweep(amp_device, amp_dtype, amp_compile_backend)
    judged = [o for o in ops if o.compiled is not None]
    skipped = [o for o in ops if o.compiled is None]
    amp_record(
        "compiled.catalogue.ops_not_compiled",
        len(skipped),
        dtype=amp_dtype,
        device=amp_device,
        tags={o.name: o.why for o in skipped},
        note=f"{len(judged)} of {len(ops)} catalogue ops compiled and compared; not compiled: "
        + (", ".join(o.name for o in skipped) or "none"),
    )
    amp_record.require(
        compare_data(
            f"catalogue ops compiled under autocast ({len(judged)} ops)",
            {o.name: o.eager for o in judged},
            {o.name: o.compiled for o in judged},
        ),
        dtype=amp_dtype,
        device=amp_device,
        repro=ops_repro_of(ops, amp_device, amp_dtype, amp_compile_backend),
    )
