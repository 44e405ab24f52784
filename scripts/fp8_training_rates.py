"""Error rates of the float8 training rule (docs/fp8.md), on the MLP.

False alarms: for each recipe, the float8 run on seed k against fp32 seed k, over SEEDS seeds, with
the seed band of fp32 seed k and five others. Detection: the same for tensorwise with every gradient
element multiplied by (1 + sigma N(0, 1)) (the training suite's injected fault), per sigma.

    python scripts/fp8_training_rates.py [SEEDS]      # about 4 minutes for 16 seeds on 2 CPU cores
"""

from __future__ import annotations

import dataclasses
import statistics
import sys

from harness.domains.fp8.recipes import RECIPES
from harness.domains.fp8.training import FP8_PARITY_FRACTION, float8_recipe, float8_setup
from harness.domains.training import FP32, SETUPS, Run, parity, seed_band, train

BAND_SEEDS = 5
NOISE = (2.0**-3, 2.0**-2, 2.0**-1, 1.0)


def worst(run: Run, fp: list[Run], k: int) -> float:
    others = [r for j, r in enumerate(fp) if j != k][:BAND_SEEDS]
    return parity(run, fp[k], seed_band([fp[k], *others]), FP8_PARITY_FRACTION).worst


def main(seeds: int) -> None:
    setup = SETUPS["mlp"]
    fp = [train(setup, FP32, k) for k in range(seeds + BAND_SEEDS)]
    print(
        f"| recipe | injected gradient noise | seeds | fail (worst > {FP8_PARITY_FRACTION} x band) | median worst | largest worst |"
    )
    print("|---|---|---|---|---|---|")
    for name in RECIPES:
        f8 = float8_setup(setup, name)
        ws = [worst(train(f8, float8_recipe(name), k), fp, k) for k in range(seeds)]
        fails = sum(w > 1.0 for w in ws)
        print(f"| {name} | none | {seeds} | {fails} | {statistics.median(ws):.2f} | {max(ws):.2f} |", flush=True)
    f8 = float8_setup(setup, "tensorwise")
    for sigma in NOISE:
        recipe = dataclasses.replace(float8_recipe("tensorwise"), grad_noise=sigma)
        ws = [worst(train(f8, recipe, k), fp, k) for k in range(seeds // 2)]
        fails = sum(w > 1.0 for w in ws)
        print(
            f"| tensorwise | sigma {sigma:g} | {seeds // 2} | {fails} | {statistics.median(ws):.2f} | {max(ws):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
