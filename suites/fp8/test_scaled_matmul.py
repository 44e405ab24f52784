"""Claim family: scaled fp8 matrix products are as accurate as their formats allow, no less.

``torch._scaled_mm`` (CPU; CUDA from SM 8.9) and torchao's Float8Linear (output, input gradient,
weight gradient, per recipe) are compared with float64 on the same high-precision operands. Where
the kernel set has no fp8 matmul (``harness.platform.kernels``), the ``_scaled_mm`` checks skip
naming it and Float8Linear is judged through torchao's emulated matmul (same casts and scales). Two
budgets come from the operands' formats, their scales and the reduction length
(``harness/domains/engines/scaled/matmul.py``): an elementwise worst-case bound, and an SQNR floor from the
standard model of rounding error. The bf16 autocast product's SQNR is recorded beside as context.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.engines.scaled.matmul import Operand, budget, sqnr
from harness.domains.engines.scaled.products import product_against_float64
from harness.domains.fp8 import adapters, linear, recipes
from harness.numerics.comparison import compare_bound, compare_within
from harness.numerics.formats import BF16, FP8_E4M3FN, FP8_E5M2, format_of
from harness.numerics.scaled import CastSpec, Granularity
from harness.platform import kernels

pytestmark = pytest.mark.amp_capability("fp8")

#: small on purpose: the CPU kernels of e4m3 x e4m3 are slow on some hardware classes (see docs)
M, K, N = 32, 64, 48

#: (a's spec, b's spec) of the product a @ b^T: the operand pairs the recipes use
PAIRS = {
    "tensorwise-e4m3xe4m3": (CastSpec(FP8_E4M3FN), CastSpec(FP8_E4M3FN)),
    "tensorwise-e5m2xe4m3": (CastSpec(FP8_E5M2), CastSpec(FP8_E4M3FN)),
    "rowwise-e4m3xe4m3": (
        CastSpec(FP8_E4M3FN, Granularity.AXIS, -1, power_of_2=True),
        CastSpec(FP8_E4M3FN, Granularity.AXIS, -1, power_of_2=True),
    ),
}


def _judge(amp_record, name, actual, a: Operand, b: Operand, out_fmt, device, tags=None, script=None):
    """``script``: (what, the block of fp8's ``scripts/products.py`` and its values, its tensors, what it needs), for the
    standalone reproduction of a failure."""
    ref = a.values @ b.values
    bud = budget(a, b, out=out_fmt)
    repro = None
    if script is not None:
        what, product, tensors, needs = script
        repro = product_against_float64(
            "fp8", what, product, tensors, bud.bound, bud.sqnr_floor_db, bud.origin, needs=needs, device=str(device)
        )
    _require(
        amp_record, compare_within(name, actual, ref, bud.bound, bud.origin), actual, ref, bud, device, tags, repro
    )


def _require(amp_record, comparison, actual, ref, bud, device, tags, repro) -> None:
    """A product's element-wise budget and SQNR floor, each kept with ``repro``; its SQNR recorded."""
    name = comparison.name
    amp_record.require(comparison, device=device, tags=tags, repro=repro)
    measured = sqnr(actual.cpu(), ref)
    amp_record.require(
        compare_bound(f"{name}.sqnr_shortfall_db", max(0.0, bud.sqnr_floor_db - measured), 0.0, bud.origin, unit="dB"),
        device=device,
        tags={**(tags or {}), "sqnr_db": round(measured, 2), "floor_db": round(bud.sqnr_floor_db, 2)},
        repro=repro,
    )
    amp_record(f"{name}.sqnr_db", measured, unit="dB", device=device, note=f"floor {bud.sqnr_floor_db:.1f} dB")


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_scaled_mm_is_within_its_error_budget_and_sqnr_floor(
    pair, out_dtype, amp_device, amp_record, fp8_scaling_under_test
):
    missing = kernels.scaled_mm_missing(amp_device)
    if missing is not None:  # the claim is the kernel's: nothing stands in for it
        pytest.skip(missing)
    spec_a, spec_b = PAIRS[pair]
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    sa, sb = fp8_scaling_under_test.scale(a, spec_a), fp8_scaling_under_test.scale(b, spec_b)
    qa = fp8_scaling_under_test.cast(a, sa, spec_a).to(amp_device)
    qb = fp8_scaling_under_test.cast(b, sb, spec_b).to(amp_device)
    inv_a = sa.reciprocal().reshape(-1, 1) if sa.dim() else sa.reciprocal()
    inv_b = sb.reciprocal().reshape(1, -1) if sb.dim() else sb.reciprocal()
    c = torch._scaled_mm(
        qa, qb.t(), scale_a=inv_a.to(amp_device), scale_b=inv_b.to(amp_device), out_dtype=getattr(torch, out_dtype)
    )
    a64, b64 = a.double(), b.double().t()
    opa = Operand(a64, spec_a.fmt, linear.scale_tensor(a, spec_a))
    opb = Operand(b64, spec_b.fmt, linear.scale_tensor(b, spec_b).t())
    script = None
    if isinstance(fp8_scaling_under_test, adapters.TorchaoScaling):  # a user's scaling cannot run in a script
        script = (
            f"torch._scaled_mm of fp8 operands ({pair}, {out_dtype} out) against float64",
            ("scaled_mm", {"OUT_DTYPE": f"torch.{out_dtype}", "GEMM": "'output'"}),
            {"qa": qa, "qb": qb, "inv_a": inv_a, "inv_b": inv_b, "x": a, "w": b},  # against x @ w^T in float64
            ("torch",),
        )
    _judge(amp_record, f"scaled_mm.{pair}.{out_dtype}", c, opa, opb, format_of(out_dtype), amp_device, script=script)
    # context: the same product under bf16 autocast, against the same float64 reference
    with torch.autocast(amp_device.type, dtype=torch.bfloat16):
        eager = a.to(amp_device) @ b.to(amp_device).t()
    amp_record(f"scaled_mm.{pair}.bf16_autocast_sqnr_db", sqnr(eager.cpu(), a64 @ b64), unit="dB", device=amp_device)


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_float8_linear_output_and_gradients_are_within_budget(name, amp_torchao, amp_device, amp_record):
    """Float8Linear's three matmuls against float64 on the same input, weight and output gradient,
    with the budget of the operands' casts as the recipe specifies them."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(M, K, generator=g)
    go = torch.randn(M, N, generator=g)
    lin = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g) / K**0.5)
    w = lin.weight.detach().clone()
    # without an fp8 kernel, torchao's emulated matmul: the same casts and scales, the product of the
    # dequantised operands in fp32, which the budget (k products, two divisions by scales) also bounds
    missing = kernels.scaled_mm_missing(amp_device)
    tags = {"recipe": name, "matmul": "torchao emulated" if missing else "torch._scaled_mm"}
    if missing is not None:
        amp_record(f"float8_linear.{name}.matmul_emulated", True, device=amp_device, tags=tags, note=missing)
    for p in linear.products(name, x, w, go, amp_device, emulate=missing is not None):
        _require(
            amp_record,
            p.comparison(f"float8_linear.{name}.{p.gemm}"),
            p.actual,
            p.reference,
            p.budget,
            amp_device,
            tags,
            linear.script(name, p, x, w, go, emulate=missing is not None),
        )
    with torch.autocast(amp_device.type, dtype=torch.bfloat16):
        eager = lin.to(amp_device)(x.to(amp_device))
    amp_record(
        f"float8_linear.{name}.bf16_autocast_output_sqnr_db",
        sqnr(eager.detach().cpu(), x.double() @ w.double().t()),
        unit="dB",
        device=amp_device,
        tags={**tags, "bf16_u": BF16.unit_roundoff},
    )
