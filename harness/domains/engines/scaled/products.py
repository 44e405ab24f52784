"""A low-precision product of a linear (float8's or a block-scaled one's) as a standalone script
against the product in float64: ``scripts/products.py``, one block per way of making the product."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.domains.repro import FailureRepro, ScriptTemplate

PRODUCTS = ScriptTemplate(__package__ or "harness.domains.engines.scaled", "products")


def product_against_float64(
    family: str,
    what: str,
    product: tuple[str, Mapping[str, str]],
    tensors: Mapping[str, torch.Tensor],
    bound: torch.Tensor,
    floor_db: float,
    origin: str,
    *,
    needs: tuple[str, ...] = ("torch",),
    device: str = "cpu",
) -> FailureRepro:
    """A low-precision matrix product (``product``: the block of ``scripts/products.py`` that makes
    it, and its values) held to an element-wise ``bound`` (saved) and an SQNR floor, both derived
    by the check from the operands' formats and scales, against the product in float64."""
    block, values = product
    # without the output gradient saved, the forward's product is the only one the script can judge
    reference = "reference" if "go" in tensors else "reference_output"
    code = PRODUCTS.fill("parameters", block, reference, "judgement", values={**values, "FLOOR_DB": repr(floor_db)})
    return FailureRepro(family, what, code, origin, {**tensors, "bound": bound.detach()}, needs, device)
