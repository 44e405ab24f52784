"""Claim family: fp8 scaled matmul is as fast, against bf16 matmul, as this class of machine was.

The same speed check as ``suites/speed`` (interleaved rounds, the thread CPU clock on CPUs and CUDA
events on GPUs, the class's calibrated threshold; recorded, not judged, until ``amp-harness
calibrate --cases scaled_mm_e4m3/float8_e4m3fn`` has calibrated the class). Whether fp8 pays off on
the class is recorded as a finding of its own.
"""

from __future__ import annotations

import pytest

from harness.domains.fp8 import speed

pytestmark = pytest.mark.amp_capability("speed")


@pytest.mark.parametrize("case", speed.CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_fp8_scaled_matmul_speed_meets_the_class_threshold(case, amp_speedup):
    name, dtype_name = case
    amp_speedup(speed.WORKLOADS[name], dtype_name, calibrate_flags=f"--cases {name}/{dtype_name}")
