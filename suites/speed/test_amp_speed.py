"""Claim family: mixed precision is as fast on this machine as this class of machine was.

The source text claims 2-3x speedups and warns that on CPUs or old GPUs mixed precision can be
slower. Each workload's AMP-over-fp32 speedup is measured in one run, interleaved (fp32, AMP,
fp32, AMP ...), and judged against the threshold calibrated on this machine's *hardware class*
(``<baseline-dir>/profiles/<class>.json``, written by ``amp-harness calibrate``): relative to the
class's own speed, so a 1.3x slower AMP path fails whether AMP is 4x faster or 2x slower there.
A failure counts only when a second measurement confirms it. A class with no calibration is
measured and recorded, NOT JUDGED, with the command that calibrates it. Whether AMP pays off on the class is reported as a finding of its own.

Each case is measured at the smallest rung of its size ladder that is compute-bound on the device
(a GPU runs matmuls of thousands per side, the CPU kinds today's sizes), and records each path's
achieved FLOP/s against the device's peak. On a GPU whose tensor cores run the AMP dtype, a
compute-bound case slower in AMP than in fp32 fails, calibrated or not (the physics floor).
"""

from __future__ import annotations

import pytest

from harness.domains.speed import thresholds
from harness.domains.speed.workloads import WORKLOADS

pytestmark = pytest.mark.amp_capability("speed")

THOROUGH = [
    (w, d)
    for w in WORKLOADS
    for d in ("bfloat16", "float16")
    if (w, d) not in thresholds.DEFAULT_CASES and (w, d) not in thresholds.GPU_CASES
]

#: Where bf16 is emulated (AVX2-only kernels) one bf16 matmul_1024 takes seconds, and the
#: default tier keeps matmul_512's bf16 case to judge the same kernel there.
HEAVY_WHERE_EMULATED = {("matmul_1024", "bfloat16"): "bf16"}

#: The default tier's cases, then the wider sweep (thorough tier).
CASES = [
    *(
        pytest.param(c, marks=pytest.mark.amp_thorough_where_emulated(HEAVY_WHERE_EMULATED[c]))
        if c in HEAVY_WHERE_EMULATED
        else c
        for c in thresholds.DEFAULT_CASES
    ),
    *(pytest.param(c, marks=pytest.mark.amp_thorough_on("cpu")) for c in thresholds.GPU_CASES),
    *(pytest.param(c, marks=pytest.mark.amp_thorough) for c in THOROUGH),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_amp_speedup_meets_the_class_threshold(case, amp_speedup):
    name, dtype_name = case
    amp_speedup(WORKLOADS[name], dtype_name)


@pytest.mark.amp_cuda
def test_launch_overhead_is_reported_apart_from_arithmetic(amp_device, amp_dtype, amp_record):
    """A launch-bound case on purpose: a 64 x 64 matmul eager and replayed from a CUDA graph. The
    sized cases above measure arithmetic; this one says what a launch costs on this stack (a
    driver or torch release that slows launches shows here, not as a lost speedup)."""
    from harness.domains.engines.bench import sizing

    if amp_device.type != "cuda":
        pytest.skip("the launch-bound case times GPU launches (CUDA graphs): the CPU has none to take apart")
    t = sizing.launch_overhead(amp_device, amp_dtype)
    note = f"a {sizing.LAUNCH_BOUND_N}x{sizing.LAUNCH_BOUND_N} matmul: eager (launch and arithmetic) vs a CUDA graph"
    for metric, value in (("eager_s", t.eager_s), ("graph_s", t.graph_s), ("launch_overhead_s", t.overhead_s)):
        amp_record(f"launch_bound.{metric}", value, unit="s", dtype=amp_dtype, device=amp_device, note=note)
