"""Error rates of the float8 training rule (docs/fp8.md), on the MLP (or the tiny LM).

False alarms: for each recipe, the float8 run on seed k against fp32 seed k, over SEEDS seeds, with
the seed band of fp32 seed k and five others; beside it, the median over seeds of its worst gap over
bf16 autocast's on the same seed. Detection (MLP): the same for tensorwise with every gradient
element multiplied by (1 + sigma N(0, 1)) (the training suite's injected fault), per sigma.

    python scripts/fp8_training_rates.py [SEEDS] [SETUP]   # mlp: about 4 minutes for 16 seeds on 2 CPU cores
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from harness.domains.engines.scaled.band import FP8_PARITY_FRACTION
from harness.domains.engines.training import BF16, FP32, SETUPS, Run, seed_band, train
from harness.domains.engines.training.parity import parity
from harness.domains.fp8.recipes import RECIPES
from harness.domains.fp8.training import float8_recipe, float8_setup

BAND_SEEDS = 5
NOISE = (2.0**-3, 2.0**-2, 2.0**-1, 1.0)


def worst(run: Run, fp: list[Run], k: int) -> float:
    others = [r for j, r in enumerate(fp) if j != k][:BAND_SEEDS]
    return parity(run, fp[k], seed_band([fp[k], *others]), FP8_PARITY_FRACTION).worst


def main(seeds: int, setup_name: str) -> None:
    setup = SETUPS[setup_name]
    fp = [train(setup, FP32, k) for k in range(seeds + BAND_SEEDS)]
    bf16 = [worst(train(setup, BF16, k), fp, k) for k in range(seeds)]
    print(f"{setup_name}: bf16 autocast worst {statistics.median(bf16):.3f} (median), {max(bf16):.3f} (largest)")
    print(
        f"| recipe | injected gradient noise | seeds | fail (worst > {FP8_PARITY_FRACTION} x band) | median worst | "
        "largest worst | median gap / bf16's |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in RECIPES:
        f8 = float8_setup(setup, name, emulate=setup_name != "mlp")  # the suite's LM: torchao's emulated matmul
        ws = [worst(train(f8, float8_recipe(name), k), fp, k) for k in range(seeds)]
        fails = sum(w > 1.0 for w in ws)
        ratio = statistics.median(w / b for w, b in zip(ws, bf16, strict=True))
        print(
            f"| {name} | none | {seeds} | {fails} | {statistics.median(ws):.2f} | {max(ws):.2f} | {ratio:.0f} |",
            flush=True,
        )
    if setup_name != "mlp":
        return
    f8 = float8_setup(setup, "tensorwise")
    for sigma in NOISE:
        recipe = dataclasses.replace(float8_recipe("tensorwise"), grad_noise=sigma)
        ws = [worst(train(f8, recipe, k), fp, k) for k in range(max(1, seeds // 2))]  # one seed at least
        fails = sum(w > 1.0 for w in ws)
        print(
            f"| tensorwise | sigma {sigma:g} | {len(ws)} | {fails} | {statistics.median(ws):.2f} | {max(ws):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seeds", nargs="?", type=int, default=16, help="seeds per recipe (default 16)")
    ap.add_argument("setup", nargs="?", default="mlp", choices=sorted(SETUPS), help="the training setup (default mlp)")
    args = ap.parse_args()
    main(args.seeds, args.setup)
