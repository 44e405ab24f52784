"""Error rates of the block-scaled training steps' two claims (docs/fp8.md).

For each recipe and seed: the block-scaled run (torchao's MX linear, NVFP4 emulated over torchao's
quantiser) keeps its lane states; from each, the step is taken again and judged by the AMP lane's
accuracy rule (error / the correctly rounded step's <= 2) and by the conformance rule (distance
from the correctly rounded step / the specification's own float32 evaluation's <= 2). Clean runs
give the false alarms; faults from the same states give what each rule catches: e5m2 or e2m1
output gradients in MXFP8 (a format slip in the backward), block scales one binade high, and
relative gradient noise (the smallest level each rule fails at every larger level too).

    python scripts/block_lane_rates.py [SEEDS] [SETUP] [NOISE_SEEDS]   # mlp: ~1 minute for 16 seeds
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import torch

from harness.domains.block_scaled.blocklinear import EmulatedBlockLinear, TorchaoBlockLinear
from harness.domains.block_scaled.blockquant import BlockQuantized, TorchaoBlockScaling
from harness.domains.block_scaled.blocktraining import (
    block_lane,
    block_lane_reference,
    block_recipe,
    block_setup,
    step_conformance,
)
from harness.domains.engines.training import amp_lane as L
from harness.domains.engines.training.loop import step_from
from harness.domains.training import SETUPS, train
from harness.numerics import blockscaled as B
from harness.numerics.formats import FP8_E4M3FN

RECIPES = ("mxfp8-rceil", "mxfp8-floor", "mxfp4-rceil", "nvfp4")
#: seeds whose runs also take the noise ladder (each level: every checkpoint's step again)
NOISE_SEEDS = 3
NOISE = tuple(2.0**k for k in (-22, -20, -18, -16, -14, -12, -10, -8, -6, -5, -4, -3, -2, -1, 0))


class _BinadeHigh(TorchaoBlockScaling):
    """Every block scale stored one binade high (tests/faults/block_scaled.py's BlockScaleOneBinadeHigh)."""

    name = "scales one binade high"

    def quantize(self, x: torch.Tensor, spec: B.BlockSpec) -> BlockQuantized:
        good = super().quantize(x, spec)
        step = 1 if spec.scale_format == "e8m0" else 1 << FP8_E4M3FN.mantissa_bits
        return dataclasses.replace(good, scale_codes=good.scale_codes + step, values=good.values * 2)


def _noisy(linear, setup, spec_id, run, ref, level: float, float32: tuple[float, ...]) -> tuple[float, float]:
    """Both rules' statistics with relative gradient noise ``level`` in every step (``float32``: the
    clean run's float32 distances, the conformance rule's denominators)."""
    noisy = dataclasses.replace(block_recipe(spec_id), name=f"{spec_id}+noise", grad_noise=level)
    lane = L.amp_lane(block_setup(setup, spec_id, linear), noisy, run, ref, kernel=False)
    dist = []
    for t, d_emu in sorted(ref.emulated_steps.items()):
        b, a = step_from(block_setup(setup, spec_id, linear), noisy, run.states[t], seed=run.seed, step=t + 1)
        dist.append(float((a - b - d_emu).norm()) / float(ref.exact[t].norm()))
    return lane.ratio, statistics.median(d / f for d, f in zip(dist, float32, strict=True))


def _limit(ratios: dict[float, float]) -> str:
    """The smallest level whose ratio exceeds the rule's, with every larger level's too."""
    limit = None
    for level in sorted(ratios, reverse=True):
        if not ratios[level] > L.LANE_FACTOR:
            break
        limit = level
    return "none" if limit is None else f"2^{int(torch.log2(torch.tensor(limit)))}"


def main(seeds: int, setup_name: str, noise_seeds: int = NOISE_SEEDS) -> None:
    setup = SETUPS[setup_name]
    print(f"{setup_name}, {seeds} seeds; rule: median ratio <= {L.LANE_FACTOR:g} for both")
    print(
        "| recipe | implementation | runs | accuracy ratio (median, largest) | fails | conformance ratio (median, largest) | fails |"
    )
    print("|---|---|---|---|---|---|---|")
    for spec_id in RECIPES:
        faults: list[tuple[str, object]] = [("torchao (clean)", TorchaoBlockLinear())]
        if spec_id.startswith("mxfp8"):
            faults += [
                ("e5m2 gradients", TorchaoBlockLinear(grad_dtype=torch.float8_e5m2)),
                ("e2m1 gradients", TorchaoBlockLinear(grad_dtype=torch.float4_e2m1fn_x2)),
            ]
        faults.append(("scales one binade high", EmulatedBlockLinear(_BinadeHigh())))
        rows: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name, _ in faults}
        noise: dict[float, list[tuple[float, float]]] = {level: [] for level in NOISE}
        clean = faults[0][1]
        for k in range(seeds):
            run = train(
                block_setup(setup, spec_id, clean), block_recipe(spec_id), k, keep_states_at=L.lane_steps(setup)
            )
            ref = block_lane_reference(setup, spec_id, run)
            float32: tuple[float, ...] = ()
            for name, linear in faults:
                lane, _ = block_lane(setup, spec_id, linear, run, ref)
                c = step_conformance(setup, spec_id, linear, run, ref)
                float32 = float32 or c.float32
                rows[name][0].append(lane.ratio)
                rows[name][1].append(c.ratio)
            if k < noise_seeds:
                for level in NOISE:
                    noise[level].append(_noisy(clean, setup, spec_id, run, ref, level, float32))
        for name, (acc, conf) in rows.items():
            print(
                f"| {spec_id} | {name} | {seeds} | {statistics.median(acc):.3g}, {max(acc):.3g} | "
                f"{sum(r > L.LANE_FACTOR for r in acc)} | {statistics.median(conf):.3g}, {max(conf):.3g} | "
                f"{sum(r > L.LANE_FACTOR for r in conf)} |",
                flush=True,
            )
        acc_limit = _limit({lv: statistics.median(r[0] for r in v) for lv, v in noise.items()})
        conf_limit = _limit({lv: statistics.median(r[1] for r in v) for lv, v in noise.items()})
        print(
            f"| {spec_id} | gradient noise caught from ({min(seeds, noise_seeds)} seeds) | | {acc_limit} | | {conf_limit} | |",
            flush=True,
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("seeds", nargs="?", type=int, default=16, help="seeds per recipe (default 16)")
    ap.add_argument("setup", nargs="?", default="mlp", choices=sorted(SETUPS), help="the training setup (default mlp)")
    ap.add_argument(
        "noise_seeds", nargs="?", type=int, default=NOISE_SEEDS, help=f"seeds per noise level (default {NOISE_SEEDS})"
    )
    args = ap.parse_args()
    main(args.seeds, args.setup, args.noise_seeds)
