"""Error rates of the block-scaled linear budgets (docs/fp8.md), on torchao's linear.

False alarms: each recipe's three products on SEEDS seeds of the suite's operands (64x128x96,
Gaussian), judged by the suite's two budgets; the suite itself runs seed 0. Detection: the same
with the output gradient cast one format coarser than the recipe names (MXFP8 gradients in e5m2,
one mantissa bit less; in e2m1), the smallest format slip a recipe table can make.

    python scripts/block_linear_rates.py [SEEDS]      # about 2 minutes for 200 seeds on 2 CPU cores
"""

from __future__ import annotations

import argparse

import torch

from harness.domains.block_scaled.blocklinear import PRODUCTS, TorchaoBlockLinear, linear_products, product_budgets
from harness.domains.engines.scaled.matmul import sqnr
from harness.numerics import blockscaled as B

M, K, N = 64, 128, 96
RECIPES = ("mxfp8-rceil", "mxfp8-floor", "mxfp4-rceil", "mxfp4-floor", "nvfp4", "nvfp4-single-level")


def judge(linear: TorchaoBlockLinear, spec: B.BlockSpec, seed: int) -> dict[str, tuple[float, float]]:
    """Per product: (worst error / elementwise bound, SQNR margin over the floor in dB)."""
    gen = torch.Generator().manual_seed(seed)
    x, w, g = (torch.randn(*shape, generator=gen) for shape in ((M, K), (N, K), (M, N)))
    products = linear_products(linear, x, w, g, spec)
    out = {}
    for name, (ref, bud) in product_budgets(x, w, g, spec).items():
        actual = getattr(products, name).detach().to(torch.float64)
        out[name] = (float(((actual - ref).abs() / bud.bound).max()), sqnr(actual, ref) - bud.sqnr_floor_db)
    return out


def row(label: str, linear: TorchaoBlockLinear, spec_id: str, seeds: int) -> None:
    spec = B.SPECS[spec_id]
    runs = [judge(linear, spec, k) for k in range(seeds)]
    fails = sum(any(r > 1.0 or m < 0.0 for r, m in run.values()) for run in runs)
    ratio = max(r for run in runs for r, _ in run.values())
    margins = [m for run in runs for _, m in run.values()]
    print(
        f"| {spec_id} | {label} | {seeds} | {fails} | {ratio:.2f} | {min(margins):.2f} | {max(margins):.2f} |",
        flush=True,
    )


def main(seeds: int) -> None:
    print("| recipe | fault | seeds | runs failing | largest error / bound | smallest SQNR margin (dB) | largest |")
    print("|---|---|---|---|---|---|---|")
    clean = TorchaoBlockLinear()
    for spec_id in RECIPES:
        row("none", clean, spec_id, seeds)
    for dtype, label in ((torch.float8_e5m2, "gradients in e5m2"), (torch.float4_e2m1fn_x2, "gradients in e2m1")):
        row(label, TorchaoBlockLinear(grad_dtype=dtype), "mxfp8-rceil", seeds)
    print(f"products judged per run: {', '.join(PRODUCTS)}; a run fails if any product breaks either budget")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seeds", nargs="?", type=int, default=200, help="seeds of the operands (default 200)")
    main(ap.parse_args().seeds)
