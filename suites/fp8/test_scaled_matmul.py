"""Claim family: scaled fp8 matrix products are as accurate as their formats allow, no less.

``torch._scaled_mm`` (CPU; CUDA from SM 8.9) and torchao's Float8Linear (output, input gradient,
weight gradient, per recipe) are compared with float64 on the same high-precision operands. Where
the kernel set has no fp8 matmul (``harness.platform.kernels``), the ``_scaled_mm`` checks skip
naming it and Float8Linear is judged through torchao's emulated matmul (same casts and scales). Two
budgets come from the operands' formats, their scales and the reduction length
(``harness/domains/fp8/matmul.py``): an elementwise worst-case bound, and an SQNR floor from the
standard model of rounding error. The bf16 autocast product's SQNR is recorded beside as context.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from harness.domains.failure_repro import product_against_float64
from harness.domains.fp8 import adapters, recipes
from harness.domains.fp8.adapters import import_torchao
from harness.domains.fp8.conformance import scale_shape
from harness.domains.fp8.matmul import Operand, budget, sqnr
from harness.numerics.comparison import compare_bound, compare_within
from harness.numerics.formats import BF16, FP8_E4M3FN, FP8_E5M2, FP32, format_of
from harness.numerics.scaled import CastSpec, Granularity, scales
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


def _scale_tensor(x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
    """The reference's scales of ``x`` (rows: its first dim), shaped to broadcast against it."""
    return torch.tensor(scales(x.tolist(), spec), dtype=torch.float64).reshape(scale_shape(*x.shape, spec))


def _judge(amp_record, name, actual, a: Operand, b: Operand, out_fmt, device, tags=None, script=None):
    """``script``: (what, source setting ``got`` and ``ref``, its tensors, what it needs), for the
    standalone reproduction of a failure."""
    ref = a.values @ b.values
    bud = budget(a, b, out=out_fmt)
    repro = None
    if script is not None:
        what, product, tensors, needs = script
        repro = product_against_float64(
            what, product, tensors, bud.bound, bud.sqnr_floor_db, bud.origin, needs=needs, device=str(device)
        )
    amp_record.require(compare_within(name, actual, ref, bud.bound, bud.origin), device=device, tags=tags, repro=repro)
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
    opa = Operand(a64, spec_a.fmt, _scale_tensor(a, spec_a))
    opb = Operand(b64, spec_b.fmt, _scale_tensor(b, spec_b).t())
    script = None
    if isinstance(fp8_scaling_under_test, adapters.TorchaoScaling):  # a user's scaling cannot run in a script
        script = (
            f"torch._scaled_mm of fp8 operands ({pair}, {out_dtype} out) against float64",
            f"got = torch._scaled_mm(qa, qb.t(), scale_a=inv_a, scale_b=inv_b, out_dtype=torch.{out_dtype})\n"
            "# reference: the product of the operands before their casts, in float64\n"
            "ref = a.double() @ b.double().t()",
            {"qa": qa, "qb": qb, "inv_a": inv_a, "inv_b": inv_b, "a": a, "b": b},
            ("torch",),
        )
    _judge(amp_record, f"scaled_mm.{pair}.{out_dtype}", c, opa, opb, format_of(out_dtype), amp_device, script=script)
    # context: the same product under bf16 autocast, against the same float64 reference
    with torch.autocast(amp_device.type, dtype=torch.bfloat16):
        eager = a.to(amp_device) @ b.to(amp_device).t()
    amp_record(f"scaled_mm.{pair}.bf16_autocast_sqnr_db", sqnr(eager.cpu(), a64 @ b64), unit="dB", device=amp_device)


@pytest.mark.parametrize("name", sorted(recipes.RECIPES))
def test_float8_linear_output_and_gradients_are_within_budget(name, fp8_torchao, amp_device, amp_record):
    """Float8Linear's three matmuls against float64 on the same input, weight and output gradient,
    with the budget of the operands' casts as the recipe specifies them."""
    float8 = import_torchao("torchao.float8")
    spec = recipes.recipe(name)
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
    config = float8.Float8LinearConfig.from_recipe_name(name)
    if missing is not None:
        config = dataclasses.replace(config, emulate=True)
    f8 = float8.convert_to_float8_training(torch.nn.Sequential(copy.deepcopy(lin)), config=config).to(amp_device)
    xd = x.clone().to(amp_device).requires_grad_(True)
    y = f8(xd)
    y.backward(go.to(amp_device))
    grad_w = f8[0].weight.grad
    assert xd.grad is not None and grad_w is not None

    def operand(values: torch.Tensor, gemm: str, role: str, transpose: bool) -> Operand:
        """The operand ``values`` (spec layout) of ``gemm``, transposed into the product if asked."""
        cast = spec.cast(gemm, role)
        v = values.double()
        if cast is None:
            return Operand(v.t() if transpose else v)
        s = _scale_tensor(values, cast)
        return Operand(v.t() if transpose else v, cast.fmt, s.t() if transpose else s)

    # each matmul: (its result, (operand, role, transposed into the product) for a and b)
    gemms = {
        "output": (y.detach(), (x, "input", False), (w, "weight", True)),
        "grad_input": (xd.grad, (go, "grad_output", False), (w, "weight", False)),
        "grad_weight": (grad_w, (go, "grad_output", True), (x, "input", False)),
    }
    tags = {"recipe": name, "matmul": "torchao emulated" if missing else "torch._scaled_mm"}
    if missing is not None:
        amp_record(f"float8_linear.{name}.matmul_emulated", True, device=amp_device, tags=tags, note=missing)
    references = {
        "output": "x.double() @ w.double().t()",
        "grad_input": "go.double() @ w.double()",
        "grad_weight": "go.double().t() @ x.double()",
    }
    for gemm, (actual, a, b) in gemms.items():
        product = f"""import dataclasses

from torchao import float8

config = float8.Float8LinearConfig.from_recipe_name({name!r})
config = dataclasses.replace(config, emulate={missing is not None!r})  # emulated: no fp8 matmul kernel here
lin = torch.nn.Linear({K}, {N}, bias=False)
with torch.no_grad():
    lin.weight.copy_(w)
f8 = float8.convert_to_float8_training(torch.nn.Sequential(lin), config=config).to(x.device)
xd = x.clone().requires_grad_(True)
y = f8(xd)
y.backward(go)
got = {{"output": y.detach(), "grad_input": xd.grad, "grad_weight": f8[0].weight.grad}}[{gemm!r}]
# reference: the same product of the high-precision operands, in float64
ref = {references[gemm]}"""
        _judge(
            amp_record,
            f"float8_linear.{name}.{gemm}",
            actual,
            operand(a[0], gemm, a[1], a[2]),
            operand(b[0], gemm, b[1], b[2]),
            FP32,
            amp_device,
            tags,
            script=(
                f"torchao Float8Linear ({name}) {gemm} against float64",
                product,
                {"x": x, "w": w, "go": go},
                ("torch", "torchao"),
            ),
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
