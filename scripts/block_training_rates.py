"""Loss gaps of block-scaled (MX, NVFP4) training against fp32's seed band and bf16 (docs/fp8.md).

For each recipe and seed k: the block-scaled run (torchao's MX linear, NVFP4 emulated over
torchao's quantiser) against fp32 seed k, in units of the fp32 seed band (the median pairwise
distance of BAND_SEEDS other seeds); bf16 autocast on the same seed beside it. Detection: the same
with MXFP8's output gradients cast to e2m1. Then NVFP4 as the pretraining recipe trains
(harness/domains/block_scaled/nvfp4_recipe.py), as published and with each of its measures off.

    python scripts/block_training_rates.py [SEEDS] [SETUP]    # mlp: ~2 minutes for 8 seeds
"""

from __future__ import annotations

import argparse
import statistics

import torch

from harness.domains.block_scaled.blocklinear import TorchaoBlockLinear
from harness.domains.block_scaled.blocktraining import block_recipe, block_setup, converted, parity_fraction
from harness.domains.block_scaled.nvfp4_recipe import NVFP4Recipe, NVFP4RecipeLinear
from harness.domains.engines.training import BF16, FP32, SETUPS, Run, seed_band, train
from harness.domains.engines.training.parity import parity
from harness.numerics import blockscaled as B

BAND_SEEDS = 5
RECIPES = ("mxfp8-rceil", "mxfp8-floor", "mxfp4-rceil", "nvfp4")


def in_bands(run: Run, fp: list[Run], k: int) -> float:
    others = [r for j, r in enumerate(fp) if j != k][:BAND_SEEDS]
    return parity(run, fp[k], seed_band([fp[k], *others]), 1.0).worst


def main(seeds: int, setup_name: str) -> None:
    setup = SETUPS[setup_name]
    fp = [train(setup, FP32, k) for k in range(seeds + BAND_SEEDS)]
    bf16 = [in_bands(train(setup, BF16, k), fp, k) for k in range(seeds)]
    print(
        f"{setup_name}: bf16 autocast worst gap {statistics.median(bf16):.2f} (median), {max(bf16):.2f} (largest) bands"
    )
    print(
        "| recipe | linears converted | fault | seeds | median worst gap (bands) | largest | allowance (bands) | runs failing | median gap / bf16's |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [
        (spec_id, label, lambda k, linear=linear: linear)
        for spec_id in RECIPES
        for label, linear in (
            ("none", TorchaoBlockLinear()),
            ("e2m1 gradients", TorchaoBlockLinear(grad_dtype=torch.float4_e2m1fn_x2)),
        )
        if label == "none" or spec_id.startswith("mxfp8")
    ]
    # NVFP4 as the pretraining recipe trains, each of its measures switched off in turn (a fresh
    # linear per seed: its stochastic roundings and Hadamard signs drawn from that seed)
    rows += [
        ("nvfp4-recipe", label, lambda k, r=recipe: NVFP4RecipeLinear(r, seed=k))
        for label, recipe in (
            ("as published", NVFP4Recipe()),
            ("without 16x16 weight tiles", NVFP4Recipe(weight_tiles=False)),
            ("without stochastic rounding", NVFP4Recipe(stochastic_gradients=False)),
            ("without the Hadamard transform", NVFP4Recipe(hadamard=False)),
            ("none of the three", NVFP4Recipe(False, False, False)),
        )
    ]
    for name, label, make in rows:
        spec_id = "nvfp4" if name == "nvfp4-recipe" else name
        names, total = converted(setup, spec_id)
        runs = [
            in_bands(train(block_setup(setup, spec_id, make(k)), block_recipe(spec_id), k), fp, k) for k in range(seeds)
        ]
        ratio = statistics.median(w / b for w, b in zip(runs, bf16, strict=True))
        allowance = parity_fraction(B.SPECS[spec_id])
        print(
            f"| {name} | {len(names)} of {total} | {label} | {seeds} | {statistics.median(runs):.2f} | "
            f"{max(runs):.2f} | {allowance:g} | {sum(r > allowance for r in runs)} | {ratio:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seeds", nargs="?", type=int, default=8, help="seeds per recipe (default 8)")
    ap.add_argument("setup", nargs="?", default="mlp", choices=sorted(SETUPS), help="the training setup (default mlp)")
    args = ap.parse_args()
    main(args.seeds, args.setup)
