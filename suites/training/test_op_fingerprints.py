"""Claim family: every aten op of one AMP training step computes what float64 computes on the same
inputs, within its budget; the step's op fingerprint is recorded, so that ``amp-harness diff``
names the first op whose output changed between two stacks.

One step (forward and backward) of each model, at its initial weights on the evaluation batch, runs
under a dispatch mode that runs every floating op again in float64 on its inputs, upcast exactly
(``harness/domains/engines/training/diagnosis.py``): an op's own error is ``max |out - ref| / max |ref|`` in units
of its output dtype's ``u``, whatever its inputs already carry. A kernel regression in one op shows
at that op, named with the module it ran in. The budget (8 u) is about twice the largest own error a
clean step shows on these models (3.8 u: a convolution's backward in fp16).
"""

from __future__ import annotations

import pytest

from harness.domains.engines import training as T
from harness.domains.engines.training.diagnosis import first_over_budget, localise
from harness.domains.op_prints import CAST_BUDGET_U, OP_BUDGET_U
from harness.domains.training.repro import op_repro_of
from harness.numerics.comparison import compare_claim
from harness.numerics.verdict import RowKind

pytestmark = pytest.mark.amp_capability("training parity")

CASES = [("mlp", T.BF16), ("mlp", T.FP16_SCALER), ("tiny_lm", T.BF16), ("cnn_bn", T.BF16)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1].metric_id}")
def test_every_op_of_an_amp_step_stays_within_its_budget_of_float64(case, amp_device, amp_record):
    name, recipe = case
    ops = localise(T.SETUPS[name], recipe, None, amp_device)
    judged = [o for o in ops if o.error_u is not None]
    metric = f"{name}.{recipe.metric_id}"
    amp_record(
        f"{metric}.op_fingerprint",
        len(ops),
        unit="ops",
        device=amp_device,
        kind=RowKind.FINGERPRINT,
        tags={"ops": [[o.op, o.module, o.dtype, list(o.shape), o.digest] for o in ops]},
        note="the aten ops of one AMP step (forward and backward) with a hash of each output: diff names the first "
        "that changed",
    )
    first = first_over_budget(ops)
    # each op against its own budget (a cast's is tighter): the worst as a share of it
    worst = max(judged, key=lambda o: (o.error_u or 0.0) / o.budget_u, default=None)
    amp_record.require(
        compare_claim(
            f"{metric}.worst_op_budget_share",
            0.0 if worst is None else float(worst.error_u or 0.0) / worst.budget_u,
            bool(judged) and first is None,
            f"every computing aten op of one {recipe.name} step (forward and backward) is within {OP_BUDGET_U:g} u of "
            f"the same op in float64 on its own inputs, and every cast within {CAST_BUDGET_U:g} u of its input (u of "
            "its output dtype, or of the recipe's where that is narrower)",
            detail=("no op was judged: the step computed nothing in floating point",)
            if not judged
            else (f"first op over its budget: {first.describe()}",)
            if first is not None
            else (),
            allowance=1.0,
            unit="x budget",
        ),
        device=amp_device,
        dtype=str(recipe.dtype),
        tags={
            "ops": len(ops),
            "judged_ops": len(judged),
            "worst_op": None if worst is None else worst.describe(),
            "first_over_budget": None if first is None else first.describe(),
        },
        repro=op_repro_of(first, amp_device),
    )
