# Reproduces autograd-cache-ignores-autocast-dtype (torch 2.7 to before 2.13, fixed in 2.13; cpu, cuda).
# AOTAutograd's cache key records whether autocast is enabled, not its dtype: code compiled under
# bf16 autocast is served from the cache to a compile of the same code under fp16 autocast (in the
# same process after a Dynamo reset, or in a later process sharing the Inductor cache directory),
# and the fp16 region silently runs in bf16, with 8x fp16's unit roundoff. Remedy:
# torch._functorch.config.enable_autograd_cache = False
# Where: pytorch/pytorch#181564 (autocast dtype in AOTAutogradCacheDetails). Registered in
# amp-harness harness/domains/compiled/known_issues.py.
# Written on: torch 2.13.0+cpu, torchao 0.18.0, python 3.11.7, cpu-amd-zen4-f25m17-avx512bf16-t2,
# amp-harness 0.1.0, 2026-12-07.
# Needs only torch. Run: python autograd_cache_ignores_autocast_dtype.py
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
import torch._functorch.config

# The same code compiled under bf16 autocast, then (after a Dynamo reset) under fp16 autocast: the
# fp16 compile must compute in fp16. AOTAutograd's cache, keyed on "autocast enabled" but not on its
# dtype, serves the bf16 graph. Reference: the autocast dtype the region was compiled under.
torch.manual_seed(0)
w = torch.randn(16, 16, requires_grad=True)  # a weight: AOTAutograd compiles (and caches) forward and backward
x = torch.randn(8, 16)


def linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w)


seen = {}
for dtype in (torch.bfloat16, torch.float16):
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=dtype):
        out = torch.compile(linear)(w, x)
    out.float().sum().backward()  # type: ignore[no-untyped-call]
    seen[dtype] = out.dtype
wrong = {str(k): str(v) for k, v in seen.items() if k != v}
print(f"compiled under autocast, output dtype per autocast dtype: {seen}; wrong: {wrong or 'none'}")
sys.exit(1 if wrong else 0)
