"""Claim family: the numeric claims of the project's source text, checked and corrected.

Source: a widely shared explainer of mixed-precision training ("Q97: 为什么需要混合精度训练？"). Each
claim is quoted, checked against the bit-level reference and torch, and recorded as a report row; where the
text is loose, the measured correction is recorded next to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from harness.domains.formats.repro import torch_values
from harness.numerics.comparison import AnyComparison, compare_bound, compare_scalar, explain
from harness.numerics.formats import BF16, FP16, FP32, tensor_bits
from harness.numerics.tolerance import EXACT, QUOTED_TO_ONE_DECIMAL, Tolerance

pytestmark = pytest.mark.amp_capability("formats")


def quoted(sig_figs: int, value: float) -> Tolerance:
    """A figure quoted to ``sig_figs`` significant digits is exact to half a unit in its last digit."""
    last = 10 ** (math.floor(math.log10(abs(value))) - sig_figs + 1)
    return Tolerance(0.0, last / 2, f"quoted to {sig_figs} significant digits: +-{last / 2:.3g}")


@dataclass(frozen=True)
class Claim:
    id: str
    text: str
    check: Callable[[], list[AnyComparison]]
    correction: str = ""
    #: the rows that read torch, as (row, torch expression, expected): a failed one keeps a script
    #: (a failed row of the harness's own reference keeps none: the text or the harness is wrong)
    torch_rows: tuple[tuple[str, str, float], ...] = ()


def _fp16_cast(x: float) -> float:
    return FP16.decode(tensor_bits(torch.tensor([x], dtype=torch.float32).half())[0])


CLAIMS = [
    Claim(
        "fp16_range",
        "FP16的数值范围是 ±65,504 (fp16 range is +-65504)",
        lambda: [
            compare_scalar("fp16.max (reference)", FP16.max, 65504.0, EXACT),
            compare_scalar("fp16.max (torch.finfo)", torch.finfo(torch.float16).max, 65504.0, EXACT),
            compare_scalar("fp16.cast(65504)", _fp16_cast(65504.0), 65504.0, EXACT),
        ],
        torch_rows=(
            ("fp16.max (torch.finfo)", "torch.finfo(torch.float16).max", 65504.0),
            ("fp16.cast(65504)", "torch.tensor([65504.0]).half().item()", 65504.0),
        ),
    ),
    Claim(
        "fp16_smallest_positive",
        "最小正数为 2⁻²⁴（约 5.96e-8）(fp16 smallest positive is 2^-24, about 5.96e-8)",
        lambda: [
            compare_scalar("fp16.smallest_subnormal", FP16.smallest_subnormal, 2.0**-24, EXACT),
            compare_scalar("fp16.smallest_subnormal vs 5.96e-8", FP16.smallest_subnormal, 5.96e-8, quoted(3, 5.96e-8)),
            compare_scalar("fp16.cast(2^-24)", _fp16_cast(2.0**-24), 2.0**-24, EXACT),
        ],
        correction="values below 2^-25 (2.98e-8), not 5.96e-8, become 0; between them they round up to 2^-24",
        torch_rows=(("fp16.cast(2^-24)", "torch.tensor([2.0**-24]).half().item()", 2.0**-24),),
    ),
    Claim(
        "fp16_underflow_to_zero",
        "梯度…远小于 1e-8（下溢），直接截断为0 (gradients far below 1e-8 underflow to zero in fp16)",
        lambda: [
            compare_scalar("fp16.cast(1e-8)", _fp16_cast(1e-8), 0.0, EXACT),
            compare_scalar("fp16.cast(2^-25 + ulp)", _fp16_cast(FP32.decode(0x33000001)), 2.0**-24, EXACT),
        ],
        correction="the flush point is half the smallest subnormal, 2^-25 ~ 2.98e-8",
        torch_rows=(
            ("fp16.cast(1e-8)", "torch.tensor([1e-8]).half().item()", 0.0),
            (
                "fp16.cast(2^-25 + ulp)",
                "torch.tensor([0x33000001], dtype=torch.int32).view(torch.float32).half().item()",
                2.0**-24,
            ),
        ),
    ),
    Claim(
        "fp16_digits",
        "FP16的精度（约3.3位有效数字）(fp16 carries about 3.3 significant decimal digits)",
        lambda: [compare_scalar("fp16 decimal digits p*log10(2)", FP16.decimal_digits, 3.3, QUOTED_TO_ONE_DECIMAL)],
    ),
    Claim(
        "bf16_exponent_like_fp32",
        "BF16…指数位与FP32相同（8位），尾数位少（7位 vs FP16的10位）(bf16 has fp32's 8 exponent bits and 7 mantissa bits vs 10)",
        lambda: [
            compare_scalar(
                "bf16.exponent_bits - fp32.exponent_bits", BF16.exponent_bits - FP32.exponent_bits, 0, EXACT
            ),
            compare_scalar("bf16.mantissa_bits", BF16.mantissa_bits, 7, EXACT),
            compare_scalar("fp16.mantissa_bits", FP16.mantissa_bits, 10, EXACT),
        ],
    ),
    Claim(
        "bf16_range_equals_fp32",
        "BF16的数值范围与FP32一致（±3.4e38）…最小正数约1.18e-38 (bf16 range equals fp32's, +-3.4e38, smallest ~1.18e-38)",
        lambda: [
            compare_scalar("bf16.smallest_normal vs fp32", BF16.smallest_normal, FP32.smallest_normal, EXACT),
            compare_scalar("bf16.max vs 3.4e38", BF16.max, 3.4e38, quoted(2, 3.4e38)),
            compare_scalar("bf16.smallest_normal vs 1.18e-38", BF16.smallest_normal, 1.18e-38, quoted(3, 1.18e-38)),
            compare_scalar("torch bf16 finfo.max vs reference", torch.finfo(torch.bfloat16).max, BF16.max, EXACT),
        ],
        correction=(
            f"same exponent range, but bf16.max = {BF16.max:.5g} is {100 * (1 - BF16.max / FP32.max):.2f}% below "
            f"fp32.max = {FP32.max:.5g}; the smallest positive bf16 is the subnormal {BF16.smallest_subnormal:.3g}"
        ),
        torch_rows=(("torch bf16 finfo.max vs reference", "torch.finfo(torch.bfloat16).max", BF16.max),),
    ),
    Claim(
        "bf16_fewer_digits_than_fp16",
        "BF16…精度更低 (bf16 carries fewer significant digits than fp16)",
        lambda: [
            compare_bound(
                "bf16 decimal digits",
                BF16.decimal_digits,
                FP16.decimal_digits - math.log10(2),
                "at least one significand bit (log10(2) digits) fewer than fp16's p*log10(2)",
            ),
        ],
        correction=f"bf16 carries {BF16.decimal_digits:.2f} digits, fp16 {FP16.decimal_digits:.2f}",
    ),
    Claim(
        "default_loss_scale",
        "将损失值乘以一个缩放因子（如 2¹⁶ = 65536）(the loss is multiplied by a scale such as 2^16)",
        lambda: [
            compare_scalar(
                "torch.amp.GradScaler default init_scale", torch.amp.GradScaler("cpu").get_scale(), 2.0**16, EXACT
            )
        ],
        torch_rows=(("torch.amp.GradScaler default init_scale", "torch.amp.GradScaler('cpu').get_scale()", 2.0**16),),
    ),
    Claim(
        "gradients_in_bf16_normal_range",
        "LLM训练中梯度值通常在1e-6到1e-3之间，远大于BF16的下溢阈值 (gradients 1e-6..1e-3 are far above bf16's underflow)",
        lambda: [
            compare_bound(
                "bf16 relative error of 1e-6",
                abs(BF16.round(1e-6) - 1e-6) / 1e-6,
                BF16.unit_roundoff,
                "normal range: at most u_bf16",
            ),
            compare_bound(
                "bf16 relative error of 1e-3",
                abs(BF16.round(1e-3) - 1e-3) / 1e-3,
                BF16.unit_roundoff,
                "normal range: at most u_bf16",
            ),
        ],
        correction=(
            f"in fp16 1e-6 is subnormal: relative error {abs(FP16.round(1e-6) - 1e-6) / 1e-6:.2%} "
            f"vs u_fp16 = {FP16.unit_roundoff:.2%}"
        ),
    ),
]


@pytest.mark.amp_quick
@pytest.mark.parametrize("claim", CLAIMS, ids=lambda c: c.id)
def test_source_text_claim_holds(claim: Claim, amp_record):
    results = claim.check()
    by_row = {name: (name, src, expected) for name, src, expected in claim.torch_rows}
    failed = [
        r
        for r in results
        if not amp_record.result(
            r,
            check=f"claim:{claim.id}",
            tags={"claim": claim.text},
            repro=torch_values(
                f"the torch value behind the source text's claim {claim.id!r}",
                [by_row[r.name]],
                "exact: the value the format's bit layout (or torch's documented default) gives",
            )
            if r.name in by_row and not r.passed
            else None,
        )
    ]
    if claim.correction:
        amp_record(
            f"{claim.id}.correction", None, check=f"claim:{claim.id}", note=claim.correction, tags={"claim": claim.text}
        )
    assert not failed, (  # verdict recorded
        f"source claim {claim.id!r} ({claim.text}) does not hold:\n" + "\n".join(map(explain, failed))
    )
