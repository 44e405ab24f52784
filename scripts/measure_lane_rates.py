"""Measure the AMP lane's error rates (docs/decision-rules.md): false alarms over clean runs and the
smallest injected gradient noise caught in every run, per model and recipe; JSON lines on stdout.

    python scripts/measure_lane_rates.py mlp tiny_lm cnn_bn --recipes bf16 fp16+scaler --seeds 30
    python scripts/measure_lane_rates.py hf_gpt2 hf_llama hf_bert     # needs transformers

The harness's models are harness.domains.training.SETUPS; hf_* are examples.models.hf_tiny.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from harness.domains.engines import training as T
from harness.domains.engines.training import rates


def setup_named(name: str) -> T.Setup:
    if name.startswith("hf_"):
        from examples.models.hf_tiny import SETUPS

        return SETUPS[name.removeprefix("hf_")]
    return T.SETUPS[name]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--recipes", nargs="+", default=["bf16", "fp16+scaler"], choices=["bf16", "fp16+scaler"])
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    recipes = {"bf16": T.BF16, "fp16+scaler": T.FP16_SCALER}
    for name in args.models:
        for key in args.recipes:
            start = time.time()
            r = rates.lane_rates(setup_named(name), recipes[key], args.seeds)
            line = {
                "model": name,
                "recipe": key,
                "clean_runs": r.rates.clean_runs,
                "false_alarms": r.rates.false_alarms,
                "clean_ratio_max": max(r.clean_ratios),
                "clean_ratio_median": sorted(r.clean_ratios)[len(r.clean_ratios) // 2],
                "detection_limit": r.rates.detection_limit,
                "ladder": {f"{d.level:.3g}": f"{d.caught}/{d.runs}" for d in r.rates.ladder},
                "controls_caught": {k: f"{v}/{args.seeds}" for k, v in r.controls_caught.items()},
                "ladder_min_ratio": {f"{k:.3g}": round(v, 4) for k, v in r.ladder_min.items()},
                "controls_min_ratio": {k: round(v, 4) for k, v in r.controls_min.items()},
                "clean_ratios": [round(x, 4) for x in r.clean_ratios],
                "seconds": round(time.time() - start, 1),
            }
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
