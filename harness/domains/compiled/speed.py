"""Speed of compiled AMP: the probe block's forward and backward, compiled AMP against eager AMP and
against compiled fp32, as speed workloads (:class:`harness.domains.engines.bench.bench.Workload`) judged
per hardware class exactly as the speed suite judges eager AMP against fp32.

The block is the one the policy and numerics checks compile (same shapes), so the AMP path reuses
their graphs; at this size a step is dominated by per-op overhead and memory traffic, which is
what compilation removes, so the figure is the benefit of compiling AMP here, not peak FLOP/s.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.domains.compiled.probe import call_block, make_block, make_inputs
from harness.domains.compiled.runs import Backend, compile_fn
from harness.domains.engines.bench.workload import Fn, Workload


def _step(fn: Any, device: torch.device, dtype: torch.dtype | None) -> Fn:
    model = make_block(device)
    x, y = make_inputs(device)

    def run() -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = fn(model, x, y)
        out["loss"].backward()

    return run


def _compiled(backend: Backend, device: torch.device, dtype: torch.dtype | None) -> Fn:
    """The compiled step; its first call (trace, compile, one step) is timed by the measurement's
    warm-up and comes back in the timing (:attr:`harness.domains.engines.bench.bench.Timing.first_call_s`)."""
    return _step(compile_fn(call_block, backend), device, dtype)


VS_EAGER = "compiled_block_vs_eager"
VS_COMPILED_FP32 = "compiled_block_vs_compiled_fp32"


def workloads(backend: Backend = "inductor") -> dict[str, Workload]:
    """The compiled-AMP workloads for ``backend``: the speedup of compiled AMP over eager AMP, and
    over the same block compiled in fp32."""

    def amp(device: torch.device, dtype: torch.dtype | None) -> Fn:
        return _compiled(backend, device, dtype)

    return {
        VS_EAGER: Workload(
            VS_EAGER,
            amp,
            None,
            baseline=lambda device, dtype: _step(call_block, device, dtype),
            baseline_name="eager AMP",
            baseline_dtype=None,
            compiled_paths=frozenset({"amp"}),
        ),
        VS_COMPILED_FP32: Workload(
            VS_COMPILED_FP32,
            amp,
            None,
            baseline=lambda device, dtype: _compiled(backend, device, None),
            baseline_name="compiled fp32",
            compiled_paths=frozenset({"baseline", "amp"}),
        ),
    }


#: (workload, dtype) pairs of the default tier (bf16: the format of CPU autocast and of training on
#: current GPUs); the thorough tier adds float16.
#: The default tier judges compiled AMP against eager AMP (the block is compiled for the policy
#: checks already); against compiled fp32 costs one more cold compile (about 8 s on 2 cores).
DEFAULT_CASES: tuple[tuple[str, str], ...] = ((VS_EAGER, "bfloat16"),)
#: What ``amp-harness calibrate --compiled`` calibrates: compiled AMP in bf16 against both baselines
#: (float16 cases are calibrated by name, ``--cases``).
CALIBRATED_CASES: tuple[tuple[str, str], ...] = ((VS_EAGER, "bfloat16"), (VS_COMPILED_FP32, "bfloat16"))
THOROUGH_CASES: tuple[tuple[str, str], ...] = (
    (VS_COMPILED_FP32, "bfloat16"),
    (VS_EAGER, "float16"),
    (VS_COMPILED_FP32, "float16"),
)
