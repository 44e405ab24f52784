"""Claim family: a block-scaled (MXFP8, MXFP4, NVFP4) linear layer's output and both gradients
are as accurate as their formats allow, no less.

The layer under test (``block_linear_under_test``: torchao's MX linear, ``mx_mm`` with its
emulated matmul, and NVFP4 emulated over torchao's quantiser; or yours) runs forward and backward on
seeded Gaussian operands. Each of its three products is compared with float64 on the unquantised
operands, against two budgets from ``harness/domains/block_scaled/blocklinear.py``: an elementwise worst case
(each element's cast error at the exact specification's block scale, saturation included, through
the float32 product) and an SQNR floor (every cast at its worst, combined as the standard model of
rounding error combines independent errors). torchao's own published floors are recorded beside.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.block_scaled.blocklinear import (
    PRODUCTS,
    TorchaoBlockLinear,
    linear_products,
    product_budgets,
    published_floor,
    torchao_script,
)
from harness.domains.engines.scaled.matmul import sqnr
from harness.domains.engines.scaled.products import product_against_float64
from harness.numerics import blockscaled as B
from harness.numerics.comparison import compare_bound, compare_within

pytestmark = pytest.mark.amp_capability("block scaling")

#: batch x in_features x out_features: every dimension a whole number of MX (32) and NVFP4 (16)
#: blocks, so each product contracts over 2-8 blocks
M, K, N = 64, 128, 96
#: every MX and 1x16 NVFP4 recipe: a run of all three products costs ~0.2 s
RECIPES = ("mxfp8-rceil", "mxfp8-floor", "mxfp4-rceil", "mxfp4-floor", "nvfp4", "nvfp4-single-level")
SEED = 0


@pytest.mark.parametrize("spec_id", RECIPES)
def test_block_scaled_linear_output_and_gradients_are_within_budget(spec_id, block_linear_under_test, amp_record):
    spec = B.SPECS[spec_id]
    linear = block_linear_under_test
    reason = linear.unsupported(spec)
    if reason is not None:
        pytest.skip(f"{linear.name} cannot run {spec_id} here: {reason}")
    gen = torch.Generator().manual_seed(SEED)
    x, w, g = (torch.randn(*shape, generator=gen) for shape in ((M, K), (N, K), (M, N)))
    products = linear_products(linear, x, w, g, spec)
    budgets = product_budgets(x, w, g, spec)
    tags = {"implementation": linear.name, "seed": SEED, "shape": f"{M}x{K}x{N}"}
    results = []
    repros = {}
    for name in PRODUCTS:
        actual = getattr(products, name).detach().to(torch.float64).cpu()
        ref, bud = budgets[name]
        measured = sqnr(actual, ref)
        published = published_floor(spec, name)
        amp_record(
            f"{spec_id}.{name}.sqnr_db",
            measured,
            unit="dB",
            tags={**tags, "floor_db": round(bud.sqnr_floor_db, 2)}
            | ({"torchao_floor_db": published.sqnr_db, "torchao_floor_source": published.source} if published else {}),
            note=f"floor {bud.sqnr_floor_db:.1f} dB"
            + (f"; torchao's own tests hold it to {published.sqnr_db:.0f} dB" if published else ""),
        )
        if type(linear) is TorchaoBlockLinear:  # a script needs nothing of the harness: torchao's calls
            repro = product_against_float64(
                "block_scaled",
                f"torchao block-scaled linear ({spec_id}) {name} against float64",
                torchao_script(spec, name),
                {"x": x, "w": w, "go": g},
                bud.bound,
                bud.sqnr_floor_db,
                bud.origin,
                needs=("torch", "torchao"),
            )
            repros[f"{spec_id}.{name}"] = repro  # one script per product: it checks the bound and the floor
        results.append(compare_within(f"{spec_id}.{name}", actual, ref, bud.bound, bud.origin))
        results.append(
            compare_bound(
                f"{spec_id}.{name}.sqnr_shortfall_db",
                max(0.0, bud.sqnr_floor_db - measured),
                0.0,
                f"{bud.origin}; measured {measured:.2f} dB",
                unit="dB",
            )
        )
    amp_record.require_all(results, tags=tags, repro_of=lambda r: repros.get(r.name))
