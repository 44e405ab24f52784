"""Claim family: fp8 casts round every value to nearest even, and what they do with overflow,
infinities and NaN is recorded per torch release.

fp32 -> e4m3fn and e5m2 round every representable value, every midpoint between neighbours and the
fp32 values on either side of each midpoint to nearest, ties to even (exhaustive: 8-bit formats
can be enumerated; the hypothesis checks of ``test_cast_rounding.py`` sample the same claim).

The OCP FP8 formats leave overflow handling to the implementation (E4M3FN has no inf), and torch
changed its choice between releases. So the behaviour is observed, recorded and kept as a
baseline keyed by the torch minor version, never assumed: a release that changes it fails here
with a readable diff.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.domains.formats.repro import cast_outcomes, cast_rounding
from harness.domains.repro import FailureRepro
from harness.numerics.comparison import DataComparison, compare_bits, compare_claim
from harness.numerics.formats import FP8_E4M3FN, FP8_E5M2, FP32, FloatFormat, cast_bits, rounding_probes
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("formats")

FP8 = [FP8_E4M3FN, FP8_E5M2]


def _probe_inputs(fmt: FloatFormat) -> dict[str, float]:
    t = fmt.overflow_threshold
    return {
        "max": fmt.max,
        "just_below_threshold": FP32.decode(FP32.round_bits(t).bits - 1),  # type: ignore[operator]
        "threshold": t,
        "twice_max": 2 * fmt.max,
        "fp32_max": FP32.max,
        "inf": math.inf,
        "-inf": -math.inf,
        "nan": math.nan,
        "-threshold": -t,
    }


def _describe(value: float, fmt: FloatFormat) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if abs(value) == fmt.max:
        return "max" if value > 0 else "-max"
    return repr(value)


def _behaviour(outcomes: dict[str, str]) -> str:
    o = outcomes["twice_max"]
    return {"max": "saturate", "nan": "nan", "inf": "inf"}.get(o, f"other ({o})")


@pytest.mark.amp_quick
def test_fp8_overflow_inf_and_nan_behaviour_matches_this_releases_baseline(
    amp_device, cast_under_test, amp_record, amp_baseline
):
    observed: dict[str, dict[str, str]] = {}
    for fmt in FP8:
        probes = _probe_inputs(fmt)
        got = [fmt.decode(b) for b in cast_under_test(list(probes.values()), fmt, amp_device)]
        outcomes = {name: _describe(g, fmt) for name, g in zip(probes, got, strict=False)}
        outcomes["overflow_behaviour"] = _behaviour(outcomes)
        observed[fmt.name] = outcomes
        for name, x in probes.items():
            amp_record(
                f"{fmt.short}.cast({name})",
                None,
                dtype=fmt.name,
                device=amp_device,
                tags={"input": repr(x), "result": outcomes[name]},
                note="observed, baselined per torch release",
            )
        amp_record(
            f"{fmt.short}.overflow_behaviour",
            None,
            dtype=fmt.name,
            device=amp_device,
            tags={"behaviour": outcomes["overflow_behaviour"]},
            note="implementation-defined by the OCP FP8 spec",
        )
    # per device type: CPU and CUDA cast kernels are separate implementations
    amp_baseline.check(
        f"fp8_casts_{amp_device.type}",
        observed,
        key=KeyKind.STACK,
        device=str(amp_device),
        repro=lambda diff, _golden: _casts_repro(diff, cast_under_test, amp_device),
    )


def _casts_repro(diff: DataComparison, cast: object, device: torch.device) -> FailureRepro | None:
    """The casts whose outcome left the golden table, each against the table (torch's cast only:
    a cast of the harness's own tests cannot run in a script)."""
    names = {f.name: f for f in FP8}
    cases = []
    for d in diff.differences:
        fmt_name, _, probe = d.path.partition(".")
        fmt = names.get(fmt_name)
        if fmt is not None and probe in _probe_inputs(fmt) and isinstance(d.expected, str):
            cases.append((fmt_name, _probe_inputs(fmt)[probe], d.expected))
    if cast is not cast_bits or not cases:
        return None
    return cast_outcomes("torch's fp8 casts of overflow, infinities and NaN", cases, str(device))


@pytest.mark.parametrize("fmt", FP8, ids=lambda f: f.short)
def test_fp8_nan_input_gives_nan(fmt, amp_device, cast_under_test, amp_record):
    """The one fp8 behaviour every implementation must share: NaN in, NaN out."""
    got = [fmt.decode(b) for b in cast_under_test([math.nan, -math.nan], fmt, amp_device)]
    preserved = all(math.isnan(g) for g in got)
    amp_record.require(
        compare_claim(
            f"{fmt.short}.nan_preserved",
            preserved,
            preserved,
            "NaN in, NaN out",
            detail=f"{fmt.name}: NaN cast to {got}",
            expected=1.0,
            allowance=0.0,
        ),
        dtype=fmt.name,
        device=amp_device,
        repro=cast_outcomes(
            f"NaN cast to {fmt.name}", [(fmt.name, math.nan, "nan"), (fmt.name, -math.nan, "nan")], str(amp_device)
        )
        if cast_under_test is cast_bits
        else None,
    )


@pytest.mark.amp_quick
@pytest.mark.parametrize("fmt", FP8, ids=lambda f: f.short)
def test_fp32_to_fp8_rounds_every_value_and_midpoint_to_nearest_even(fmt, amp_device, cast_under_test, amp_record):
    values = rounding_probes(fmt)
    got = cast_under_test(values, fmt, amp_device)
    expected = [fmt.round_bits(v).bits for v in values]
    result = compare_bits(f"fp32->{fmt.name} exhaustive", got, expected, fmt, values)
    repro = None
    if not result.passed and cast_under_test is cast_bits:  # torch's own cast: a script can run it
        failing = [v for v, g, e in zip(values, got, expected, strict=True) if g != e]
        repro = cast_rounding(
            f"torch's float32 -> {fmt.name} cast of the failing probes: values not rounded to nearest even",
            torch.tensor(failing, dtype=torch.float32),
            getattr(torch, fmt.name),
        )
    amp_record.require(result, dtype=fmt.name, device=amp_device, tags={"probes": len(values)}, repro=repro)
