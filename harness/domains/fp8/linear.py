"""torchao's Float8Linear as three scaled products, each against float64 with the budget of its
operands' casts; and, for a float8 training run that left its band, the first linear of one step
whose products leave that budget.

Float8Linear computes ``output = x w^T``, ``grad_input = go w`` and ``grad_weight = go^T x``, each
operand cast as the recipe specifies (:mod:`harness.domains.fp8.recipes`). Each product is held to
the budget :func:`harness.domains.engines.scaled.matmul.budget` derives from the operands' formats and the
reference's own scales (:func:`harness.numerics.scaled.scales`), never torchao's. The same judgement
serves the scaled-matmul suite (a linear of random operands) and the localisation of a failed
float8 training run (the operands each linear of the model saw in one step), and a failed product
keeps a script that converts a linear with torchao and takes its products again.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from harness.domains.engines.scaled.localise import Localised, over_budget, seen_by_linears
from harness.domains.engines.scaled.matmul import Operand, ScaledBudget, budget
from harness.domains.engines.scaled.products import product_against_float64
from harness.domains.fp8 import recipes
from harness.domains.fp8.conformance import scale_shape
from harness.domains.repro import FailureRepro
from harness.numerics.comparison import ElementwiseComparison, compare_within
from harness.numerics.formats import FP32
from harness.numerics.scaled import CastSpec, scales
from harness.platform.thirdparty import import_third_party

#: Float8Linear's products: (a, role of a, a transposed), (b, role, transposed), the float64 reference
GEMMS: dict[str, tuple[tuple[str, str, bool], tuple[str, str, bool], str]] = {
    "output": (("x", "input", False), ("w", "weight", True), "x.double() @ w.double().t()"),
    "grad_input": (("go", "grad_output", False), ("w", "weight", False), "go.double() @ w.double()"),
    "grad_weight": (("go", "grad_output", True), ("x", "input", False), "go.double().t() @ x.double()"),
}


def scale_tensor(x: torch.Tensor, spec: CastSpec) -> torch.Tensor:
    """The reference's scales of ``x`` (rows: its first dim), shaped to broadcast against it."""
    return torch.tensor(scales(x.tolist(), spec), dtype=torch.float64).reshape(
        scale_shape(x.shape[0], x.shape[1], spec)
    )


@dataclass(frozen=True)
class Product:
    """One of Float8Linear's matmuls: what torchao computed, its operands as the recipe casts them
    (float64 values, format, the reference's scales), and the budget they give."""

    gemm: str
    actual: torch.Tensor
    a: Operand
    b: Operand
    budget: ScaledBudget

    @property
    def reference(self) -> torch.Tensor:
        return self.a.values @ self.b.values

    def comparison(self, name: str) -> ElementwiseComparison:
        return compare_within(name, self.actual, self.reference, self.budget.bound, self.budget.origin)


def _operand(values: torch.Tensor, spec: recipes.Fp8Recipe, gemm: str, role: str, transpose: bool) -> Operand:
    cast = spec.cast(gemm, role)
    v = values.double()
    if cast is None:
        return Operand(v.t() if transpose else v)
    s = scale_tensor(values, cast)
    return Operand(v.t() if transpose else v, cast.fmt, s.t() if transpose else s)


def products(
    name: str, x: torch.Tensor, w: torch.Tensor, go: torch.Tensor, device: torch.device | str, emulate: bool
) -> list[Product]:
    """A bias-free linear of weight ``w`` (n x k), converted by torchao for recipe ``name``
    (``emulate``: torchao's emulated matmul, for kernel sets without fp8 matmul), run forward on
    ``x`` (m x k) and backward with ``go`` (m x n): its three products and their budgets."""
    float8 = import_third_party("torchao.float8")
    spec = recipes.recipe(name)
    config = float8.Float8LinearConfig.from_recipe_name(name)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        lin.weight.copy_(w)
    f8 = float8.convert_to_float8_training(nn.Sequential(copy.deepcopy(lin)), config=config).to(device)
    xd = x.detach().clone().to(device).requires_grad_(True)
    y = f8(xd)
    y.backward(go.to(device))
    grad_w = f8[0].weight.grad
    assert xd.grad is not None and grad_w is not None
    actual = {"output": y.detach(), "grad_input": xd.grad, "grad_weight": grad_w}
    tensors = {"x": x.detach().cpu(), "w": w.detach().cpu(), "go": go.detach().cpu()}
    out = []
    for gemm, ((an, ar, at), (bn, br, bt), _ref) in GEMMS.items():
        a, b = _operand(tensors[an], spec, gemm, ar, at), _operand(tensors[bn], spec, gemm, br, bt)
        out.append(Product(gemm, actual[gemm], a, b, budget(a, b, out=FP32)))
    return out


def script(
    name: str, product: Product, x: torch.Tensor, w: torch.Tensor, go: torch.Tensor, emulate: bool, where: str = ""
) -> FailureRepro:
    """``product`` as a standalone script: the linear converted by torchao again, its three
    products taken, the failing one against the float64 product of the operands before their casts."""
    values = {"RECIPE": repr(name), "EMULATE": repr(emulate), "GEMM": repr(product.gemm)}
    return product_against_float64(
        "fp8",
        f"torchao Float8Linear ({name}) {product.gemm}{where} against float64",
        ("float8_linear", values),
        {"x": x.detach().cpu(), "w": w.detach().cpu(), "go": go.detach().cpu()},
        product.budget.bound,
        product.budget.sqnr_floor_db,
        product.budget.origin,
        needs=("torch", "torchao"),
    )


def first_linear_over_budget(
    name: str, model: nn.Module, step: Callable[[], torch.Tensor], device: torch.device | str, emulate: bool
) -> tuple[Localised | None, int]:
    """What each linear of ``model`` (converted by torchao for recipe ``name``) saw in ``step``
    (:func:`seen_by_linears`), its three products taken again from it: the first over its budget,
    and how many linears were judged."""
    seen = seen_by_linears(model, step)
    for s in seen:
        for p in products(name, s.x, s.w, s.go, device, emulate):
            worst = over_budget(p.actual, p.reference, p.budget)
            if not worst <= 1.0:
                repro = script(name, p, s.x, s.w, s.go, emulate, where=f" of the model's linear {s.path!r}")
                return Localised(s.path, p.gemm, worst, len(seen), repro), len(seen)
    return None, len(seen)
