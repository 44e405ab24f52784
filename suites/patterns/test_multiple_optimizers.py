"""Several models, losses and optimizers with one GradScaler decide their steps independently.

The AMP examples' pattern: a backward per loss (``retain_graph=True`` for the first), ``unscale_``
and ``step`` per optimizer, one ``update``. Each optimizer checks its own gradients: an inf in one
model's gradients skips that optimizer's step (its parameters bitwise as they were) while the other
steps exactly as its reference (the same optimizer stepped on the gradients unscaled by hand), and
the scale backs off once. Clean, both step as their references and the scale stays."""

from __future__ import annotations

import pytest

from harness.domains.patterns import optimizers as O
from harness.domains.patterns.repro import optimizers_repro
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("loss scaling")

#: overflow planted in: None, model 0, model 1 -> what each optimizer must do, and the scale factor
EXPECTED = {
    None: (("stepped as its reference", "stepped as its reference"), 1.0),
    0: (("skipped", "stepped as its reference"), 0.5),
    1: (("stepped as its reference", "skipped"), 0.5),
}


@pytest.mark.parametrize("overflow_in", [None, 0, 1], ids=["clean", "inf_in_model_0", "inf_in_model_1"])
def test_each_optimizer_decides_its_own_skip_and_the_scale_backs_off_once(overflow_in, amp_device, amp_record):
    seen = O.step_with_overflow_in(overflow_in, amp_device)
    (want0, want1), factor = EXPECTED[overflow_in]
    problems = [f"raised {seen.error}"] if seen.error else []
    if not seen.error:
        problems += [
            f"optimizer {i}: {got}, expected {want}"
            for i, (got, want) in enumerate(zip(seen.optimizers, (want0, want1), strict=True))
            if got != want
        ]
        if seen.scale_after != seen.scale_before * factor:
            problems.append(f"scale {seen.scale_before} -> {seen.scale_after}, expected x{factor}")
    amp_record.require(
        compare_claim(
            "two_optimizers.problems",
            len(problems),
            not problems,
            "each optimizer skips only for its own non-finite gradients, a taken step equals its reference, and "
            "an overflow backs the scale off once",
            detail=f"overflow in {overflow_in}: " + "; ".join(problems),
            expected=0,
            allowance=0,
            unit="problems",
        ),
        device=amp_device,
        tags={
            "overflow_in": overflow_in,
            "optimizers": list(seen.optimizers),
            "scale": [seen.scale_before, seen.scale_after],
        },
        repro=optimizers_repro(amp_device, overflow_in),
    )
