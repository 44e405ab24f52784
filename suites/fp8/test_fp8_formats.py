"""Claim family: fp8, e8m0 and fp4 codes and casts, checked exhaustively against bit-level references.

Every code of each format decodes to the value its bit layout defines; e8m0 and fp4 casts round as
their specifications say. How fp32 -> e4m3fn and e5m2 round, and what their overflow does, is the
formats family's (``suites/formats/test_fp8_casts.py``, the same exhaustive probes); e8m0's overflow
is baselined here. Compiled casts must give the eager bits on those probes.
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.domains.fp8 import adapters
from harness.domains.fp8.repro import code_decoding, e8m0_outcomes, e8m0_rounding, fp4_casts
from harness.domains.repro import FailureRepro
from harness.numerics.comparison import DataComparison, compare_bits, compare_claim, compare_data, explain
from harness.numerics.formats import FP4_E2M1, FP8_E4M3FN, FP8_E5M2, FP32, FloatFormat, rounding_probes, tensor_bits
from harness.numerics.scaled import E8M0_BIAS, e8m0_decode, e8m0_nearest
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("fp8")

FP8 = [FP8_E4M3FN, FP8_E5M2]


def _ids(f: FloatFormat) -> str:
    return f.short


@pytest.mark.amp_quick
@pytest.mark.parametrize("dtype_name", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_every_code_decodes_to_the_value_its_bit_layout_defines(
    dtype_name, amp_device, fp8_decode_under_test, amp_record
):
    if getattr(torch, dtype_name, None) is None:
        pytest.skip(f"torch {torch.__version__} has no torch.{dtype_name}")
    got = fp8_decode_under_test(dtype_name, amp_device)
    decode = e8m0_decode if dtype_name == "float8_e8m0fnu" else {f.name: f for f in FP8}[dtype_name].decode
    expected = [decode(c) for c in range(256)]
    bad = [
        (c, e, g)
        for c, (e, g) in enumerate(zip(expected, got, strict=True))
        if not (e == g or (math.isnan(e) and math.isnan(g)))
    ]
    amp_record.require(
        compare_claim(
            f"{dtype_name}.decode_mismatches",
            len(bad),
            not bad,
            "each of the 256 codes decodes to the bit-level reference's value (NaN to NaN)",
            detail=f"{len(bad)} codes differ; first: "
            + ", ".join(f"code {c:#04x}: expected {e!r}, got {g!r}" for c, e, g in bad[:4]),
            expected=0,
            allowance=0,
            unit="codes",
        ),
        dtype=dtype_name,
        device=amp_device,
        repro=code_decoding(f"torch's decoding of the 256 {dtype_name} codes against their bit layout", dtype_name)
        if bad and fp8_decode_under_test is adapters.torch_decode_codes  # torch's own decoding: a script can run it
        else None,
    )


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="this torch has no torch.float8_e8m0fnu")
def test_fp32_to_e8m0_rounds_to_the_nearest_power_of_two(amp_device, e8m0_cast_under_test, amp_record):
    """Away from ties, every positive fp32 in e8m0's range goes to the nearest power of two (in
    value); both sides of each tie 1.5 x 2^e are probed. Ties themselves are baselined below."""
    values: list[float] = []
    for e in range(-E8M0_BIAS, E8M0_BIAS):
        tie = 1.5 * math.ldexp(1.0, e)
        if tie < FP32.smallest_normal:  # fp32 subnormals: below the tie's resolution, probe the power only
            values.append(math.ldexp(1.0, e))
            continue
        tie_bits = FP32.round_bits(tie).bits
        assert tie_bits is not None
        values += [math.ldexp(1.0, e), FP32.decode(tie_bits - 1), FP32.decode(tie_bits + 1)]  # fp32 neighbours
    got = e8m0_cast_under_test(values, amp_device)
    bad = [(v, g) for v, g in zip(values, got, strict=True) if (g,) != e8m0_nearest(v)]
    amp_record.require(
        compare_claim(
            "float8_e8m0fnu.rounding_mismatches",
            len(bad),
            not bad,
            "fp32 -> e8m0 picks the nearest power of two for every non-tie probe",
            detail="; ".join(f"{v!r}: expected code {e8m0_nearest(v)}, got {g}" for v, g in bad[:4]),
            expected=0,
            allowance=0,
            unit="values",
        ),
        dtype="float8_e8m0fnu",
        device=amp_device,
        tags={"probes": len(values)},
        repro=e8m0_rounding(
            "torch's float32 -> e8m0 cast of the failing probes: not the nearest power of two",
            torch.tensor([v for v, _ in bad], dtype=torch.float32),
        )
        if bad and e8m0_cast_under_test is adapters.torch_e8m0_cast  # torch's own cast: a script can run it
        else None,
    )


@pytest.mark.skipif(not hasattr(torch, "float8_e8m0fnu"), reason="this torch has no torch.float8_e8m0fnu")
def test_e8m0_ties_zero_sign_and_overflow_match_this_stacks_baseline(
    amp_device, e8m0_cast_under_test, amp_record, amp_baseline
):
    """What the format leaves open (ties, zero, negatives, overflow, inf, NaN) is observed and kept
    per stack: a release that changes it fails with the case named."""
    probes = {
        "tie 1.5": 1.5,
        "tie 3.0": 3.0,
        "tie 0.75": 0.75,
        "zero": 0.0,
        "-1": -1.0,
        "2^-127": math.ldexp(1.0, -127),
        "2^-149": math.ldexp(1.0, -149),
        "2^127": math.ldexp(1.0, 127),
        "1.5 x 2^127": 1.5 * math.ldexp(1.0, 127),
        "fp32 max": FP32.max,
        "inf": math.inf,
        "nan": math.nan,
    }
    got = e8m0_cast_under_test(list(probes.values()), amp_device)
    observed = {name: {"code": g, "value": repr(e8m0_decode(g))} for name, g in zip(probes, got, strict=True)}
    for name, o in observed.items():
        amp_record(f"e8m0.cast({name})", o["code"], dtype="float8_e8m0fnu", device=amp_device, tags=o)
    amp_baseline.check(
        f"e8m0_casts_{amp_device.type}",
        observed,
        key=KeyKind.STACK,
        device=str(amp_device),
        repro=lambda diff, _golden: _e8m0_repro(diff, probes, e8m0_cast_under_test, amp_device),
    )


def _e8m0_repro(
    diff: DataComparison, probes: dict[str, float], cast: object, device: torch.device
) -> FailureRepro | None:
    """The probes whose code left the golden table, each against the table's code (torch's own
    cast only: a cast of your own cannot run in a script)."""
    cases = []
    for d in diff.differences:
        name, _, field = d.path.rpartition(".")
        if field == "code" and name in probes and isinstance(d.expected, int):
            cases.append((name, probes[name], d.expected))
    if cast is not adapters.torch_e8m0_cast or not cases:
        return None
    return e8m0_outcomes("torch's float32 -> e8m0 casts that left this release's golden table", cases, str(device))


def test_fp4_e2m1_codes_and_rounding_match_the_reference(amp_torchao, amp_device, amp_record):
    """torch has a packed fp4 dtype (float4_e2m1fn_x2) without casts; torchao's MX kernels are the
    casts MX training uses: decode of all 16 codes, round-to-nearest-even of every value and
    midpoint, and saturation beyond the largest value (the format has no inf or NaN)."""
    from harness.platform.thirdparty import import_third_party

    kernels = import_third_party("torchao.prototype.mx_formats.kernels")
    codes = torch.arange(16, dtype=torch.uint8)
    decoded = kernels.f4_unpacked_to_f32(codes).tolist()
    values = [*rounding_probes(FP4_E2M1), FP4_E2M1.max * 2, -FP4_E2M1.max * 2]
    got = kernels.f32_to_f4_unpacked(torch.tensor(values, dtype=torch.float32)).tolist()
    expected = [
        FP4_E2M1.max_finite_bits | (FP4_E2M1.sign_bit if v < 0 else 0)
        if FP4_E2M1.round_bits(v).bits is None
        else FP4_E2M1.round_bits(v).bits
        for v in values
    ]
    result = compare_data(
        "float4_e2m1fn.codes_and_rounding",
        {"decode": [FP4_E2M1.decode(c) for c in range(16)], "round": expected},
        {"decode": decoded, "round": got},
    )
    amp_record.require(
        result,
        dtype="float4_e2m1fn",
        device="cpu",
        tags={"probes": len(values)},
        repro=None
        if result.passed
        else fp4_casts(
            "torchao's e2m1 decode of the 16 codes and cast of the rounding probes",
            torch.tensor(values, dtype=torch.float32),
        ),
    )


#: Inductor's saturating fp8 cast, a known issue of the compiled family's registry
SATURATING_FP8_CAST = "inductor-fp8-cast-saturates"


@pytest.mark.amp_thorough_on("cpu")  # one Inductor compile per format: ~8 s cold on 2 CPU cores
@pytest.mark.parametrize("fmt", FP8, ids=_ids)
def test_compiled_fp8_casts_give_the_eager_bits(fmt, amp_device, amp_record):
    """Inductor generates its own cast code: on every rounding probe and the overflow, inf and NaN
    probes it must give eager's bits. Saturating at the format's largest finite value where eager
    overflows to NaN or inf is a registered known issue (``inductor-fp8-cast-saturates``), judged
    by its lifecycle; any other difference fails."""
    from harness.domains import known_issues
    from harness.domains.engines.compiler import compiling, toolchain

    missing = toolchain.unavailable(amp_device.type)
    if missing is not None:
        pytest.skip(f"no working compiler toolchain: {missing}")
    values = [*rounding_probes(fmt), 1.5 * fmt.max, 2 * fmt.max, FP32.max, math.inf, math.nan]
    values += [-v for v in values[-5:]]
    x = torch.tensor(values, dtype=torch.float32, device=amp_device)
    dtype = getattr(torch, fmt.name)
    compiled = compiling.compile_fn(lambda t: t.to(dtype), "inductor")
    eager, got = tensor_bits(x.to(dtype)), tensor_bits(compiled(x))
    # saturation: the largest finite value of the input's sign where eager gave NaN or inf
    saturated = [
        i
        for i, (v, e, a) in enumerate(zip(values, eager, got, strict=True))
        if abs(v) > fmt.max
        and not math.isnan(v)
        and not math.isfinite(fmt.decode(e))
        and fmt.decode(a) == math.copysign(fmt.max, v)
    ]
    expected = [None if i in saturated else e for i, e in enumerate(eager)]
    result = compare_bits(f"compiled fp32->{fmt.name}", got, expected, fmt, values)
    amp_record.require(result, dtype=fmt.name, device=amp_device, note=explain(result) if not result.passed else "")
    where, issue = known_issues.REGISTRIES[SATURATING_FP8_CAST]  # the compiled family's registry
    amp_record.require_registry(
        issue,
        bool(saturated),
        f"{where} ({SATURATING_FP8_CAST!r})",
        device=amp_device,
        context=f" on {amp_device.type} ({fmt.name})",
        tags={"saturated_inputs": [values[i] for i in saturated]},
        dtype=fmt.name,
    )
