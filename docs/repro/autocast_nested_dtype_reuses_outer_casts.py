# Reproduces autocast-nested-dtype-reuses-outer-casts (torch 2.4 on, open (last verified 2.15); cpu, cuda).
# a region of another low-precision dtype nested in an autocast region (float16 inside bfloat16,
# or the reverse) gets the parameter casts the outer region cached, in the outer dtype: the cache
# is keyed by the tensor, not by the dtype, so a layer's matmul raises on mixed dtypes and a
# product of two parameters silently runs in the outer dtype
# Where: aten/src/ATen/autocast_mode.cpp (cached_casts keyed by the TensorImpl alone); no report
# of this case found. Registered in amp-harness harness/domains/autocast/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-08.
# Needs only torch. Run: python autocast_nested_dtype_reuses_outer_casts.py
# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.
import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

import sys

import torch

# A region of another low-precision dtype nested in an autocast region (a block that must run in
# float16 inside a bfloat16 forward, or the reverse). Autocast's weight cache is keyed by the
# tensor, not by the dtype: the inner region's matmul gets the weight cast the outer region cached,
# in the outer dtype, and raises on mixed dtypes. Reference: the layer with its operands cast to
# the inner dtype by hand (no autocast, no cache), bit for bit.
torch.manual_seed(0)
layer = torch.nn.Linear(16, 8)
x = torch.randn(4, 16)
outcome = {}
for outer, inner in ((torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16)):
    case = f"{outer} outside, {inner} inside"
    w, b = layer.weight.detach().to(inner), layer.bias.detach().to(inner)
    by_hand = torch.nn.functional.linear(x.to(inner), w, b)
    try:
        with torch.autocast("cpu", dtype=outer):
            layer(x)
            with torch.autocast("cpu", dtype=inner):
                nested = layer(x)
    except RuntimeError as exc:
        outcome[case] = "raised: " + (str(exc).strip().splitlines() or [""])[0]
        continue
    same = nested.dtype == by_hand.dtype and torch.equal(nested, by_hand)
    outcome[case] = "as cast by hand" if same else f"{nested.dtype}, where cast by hand gives {by_hand.dtype}"
print(f"a layer used in a CPU autocast region, then in a region of another dtype nested in it: {outcome}")
sys.exit(0 if all(v == "as cast by hand" for v in outcome.values()) else 1)
