"""The distributed family's verdicts on what its rank programs returned: the reduce that must be
measurably closer than another, and a sharded scaler's skip on every rank. (Declared against
observed policy is :mod:`harness.domains.distributed.policy`'s; each reduce's budget is
:mod:`harness.numerics.budgets`'.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.numerics.comparison import ClaimComparison, compare_claim


def reduce_closer_claim(worst: Mapping[str, float]) -> ClaimComparison:
    """FSDP2's bf16 reduce misses the fp32 budget while its fp32 reduce meets it (``worst``: each
    reduce dtype's worst element in units of the fp32 budget): the check's budget can tell the
    two apart, so a reduce silently run in bf16 cannot pass as fp32."""
    return compare_claim(
        "fsdp2.bf16_reduce_exceeds_the_fp32_budget",
        worst["bfloat16"],
        worst["bfloat16"] > 1.0 >= worst["float32"],
        "the bf16 reduce misses the fp32 budget (error/budget > 1) while the fp32 reduce meets it",
        detail=f"FSDP2 bf16 reduce error/fp32-budget {worst['bfloat16']:.3g} should exceed 1 while fp32 reduce "
        f"{worst['float32']:.3g} stays within it: the fp32 reduce must be measurably closer",
        allowance=1.0,
    )


def sharded_scaler_claims(per_rank: Sequence[Mapping[str, Any]], inf_rank: int) -> tuple[ClaimComparison, ...]:
    """An inf on rank ``inf_rank`` only (``per_rank``: each rank's ``stepped`` and ``scale``): no
    rank steps, and every rank holds the same scale after the skip."""
    stepped = [bool(r["stepped"]) for r in per_rank]
    scales = [float(r["scale"]) for r in per_rank]
    return (
        compare_claim(
            "sharded_scaler.any_rank_stepped",
            any(stepped),
            not any(stepped),
            "an inf on one rank makes every rank skip the step",
            detail=f"inf only on rank {inf_rank}: ranks {[r for r, s in enumerate(stepped) if s]} stepped anyway",
            expected=0,
            allowance=0,
        ),
        compare_claim(
            "sharded_scaler.distinct_scales",
            len(set(scales)),
            len(set(scales)) == 1,
            "every rank holds the same scale after the skip",
            detail=f"inf only on rank {inf_rank}: scales differ across ranks after the skip: {scales}",
            expected=1,
            allowance=0,
        ),
    )
