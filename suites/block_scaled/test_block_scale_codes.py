"""Claim family: MX block scales are the e8m0 codes torchao's three scale modes define, and the
registered MX and NVFP4 findings are what this torchao does.

Each block's scale code follows from its amax alone (OCP MX: floor, ceil; RCEIL from the exact ratio
to the element's max, ``harness/numerics/scaled.py``): torchao's ``to_mx`` must store exactly it on
hypothesis blocks drawn over float32's range. Where torchao's float32 log2 rounds across a power of
two (RCEIL one code low), the difference is a registered finding, checked to stay inside the window
that explains it; every registered finding is observed on every run, so a release that fixes or
changes one is noticed.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harness.domains.block_scaled import known_issues
from harness.domains.block_scaled.repro import mx_scale_codes
from harness.numerics.formats import FP4_E2M1, FP8_E4M3FN, FP32
from harness.numerics.scaled import MxScaleMode, amax, mx_scale_code, near_power_of_2
from harness.platform.thirdparty import import_third_party, torchao_version

pytestmark = pytest.mark.amp_capability("block scaling")


# -- MX block scales -------------------------------------------------------------------------------------
MX_ELEMENTS = {"e4m3": FP8_E4M3FN, "e2m1": FP4_E2M1}
MX_BLOCK = 32


def _mx_blocks() -> st.SearchStrategy[list[float]]:
    """One to three blocks of 32 finite fp32 values, each block's amax drawn over the whole range."""

    def block(scale_exp: int, values: list[float]) -> list[float]:
        return [math.ldexp(v, scale_exp) for v in values]

    one = st.builds(
        block,
        st.integers(-140, 120),
        st.lists(st.floats(-4.0, 4.0, width=32), min_size=MX_BLOCK, max_size=MX_BLOCK),
    )
    return st.lists(one, min_size=1, max_size=3).map(lambda bs: [FP32.round(v) for b in bs for v in b])


@pytest.mark.parametrize("mode", list(MxScaleMode), ids=lambda m: m.value)
@pytest.mark.parametrize("elem_id", sorted(MX_ELEMENTS))
def test_mx_block_scales_equal_the_reference(elem_id, mode, amp_torchao, amp_record):
    mx = import_third_party("torchao.prototype.mx_formats.mx_tensor")
    cfg = import_third_party("torchao.prototype.mx_formats.config")
    elem = MX_ELEMENTS[elem_id]
    dtype = torch.float8_e4m3fn if elem_id == "e4m3" else torch.float4_e2m1fn_x2
    explained = 0
    with amp_record.property_run(
        f"mx.{elem_id}.{mode.value}.scale_mismatches", f"e8m0 block scale per {mode.name} (exact)", dtype=elem.name
    ) as tally:

        @settings(deadline=None)
        @given(values=_mx_blocks())
        @example(values=[0.0] * MX_BLOCK)
        @example(values=[elem.max * 2.0**-100 * (1 + 2.0**-23)] + [0.0] * (MX_BLOCK - 1))
        def prop(values: list[float]) -> None:
            nonlocal explained
            x = torch.tensor(values, dtype=torch.float32)
            codes, _ = mx.to_mx(x, dtype, MX_BLOCK, scaling_mode=cfg.ScaleCalculationMode(mode.value))
            got = codes.view(torch.uint8).flatten().tolist()
            blocks = [values[i : i + MX_BLOCK] for i in range(0, len(values), MX_BLOCK)]
            problems, excused = [], []
            for i, (b, g) in enumerate(zip(blocks, got, strict=True)):
                a = amax(b)
                want = mx_scale_code(a, elem, mode)
                if g == want:
                    continue
                if mode is MxScaleMode.RCEIL and g == want - 1 and a > 0 and near_power_of_2(a / elem.max):
                    explained += 1
                    excused.append(i)
                    continue
                problems.append(f"block amax {a!r}: expected code {want}, got {g}")
            tally.add(len(values))
            if problems:
                tally.repro = mx_scale_codes(
                    f"torchao's MX {elem_id} block scales ({mode.value}): codes unlike the block amax's",
                    x,
                    f"torch.{str(dtype).removeprefix('torch.')}",
                    elem.max,
                    mode.value,
                    MX_BLOCK,
                    excused,
                )
            assert not problems, f"MX {elem_id} {mode.value}: " + "; ".join(problems[:4])

        prop()
    amp_record(f"mx.{elem_id}.{mode.value}.rceil_deviations_explained", explained)


# -- registered findings ------------------------------------------------------------------------------------
def _observe(issue_id: str) -> tuple[bool, str]:
    if issue_id == "torchao-rceil-scale-near-power-of-2":
        mx = import_third_party("torchao.prototype.mx_formats.mx_tensor")
        cfg = import_third_party("torchao.prototype.mx_formats.config")
        block_amax = FP8_E4M3FN.max * 2.0**-100 * (1 + 2.0**-23)
        x = torch.tensor([block_amax] + [0.0] * (MX_BLOCK - 1), dtype=torch.float32)
        codes, _ = mx.to_mx(x, torch.float8_e4m3fn, MX_BLOCK, scaling_mode=cfg.ScaleCalculationMode.RCEIL)
        got = int(codes.view(torch.uint8).flatten()[0])
        want = mx_scale_code(block_amax, FP8_E4M3FN, MxScaleMode.RCEIL)
        return got != want, f"block amax {block_amax!r}: torchao code {got}, exact ceil code {want}"
    if issue_id == "torchao-nvfp4-zero-tensor-nan":
        nv = import_third_party("torchao.prototype.mx_formats.nvfp4_tensor")
        x = torch.zeros(1, 16)
        t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=nv.per_tensor_amax_to_scale(x.abs().max()))
        nans = int(t.dequantize(torch.float32).isnan().sum())
        return nans > 0, f"a 1x16 tensor of zeros dequantises to {nans} NaN of 16"
    if issue_id == "torchao-mx-smallest-scale-divisor":
        mx = import_third_party("torchao.prototype.mx_formats.mx_tensor")
        cfg = import_third_party("torchao.prototype.mx_formats.config")
        value = 2.0**-119  # = 256 x 2^-127: scale code 0 in every mode, element code 256
        x = torch.tensor([value] + [0.0] * (MX_BLOCK - 1), dtype=torch.float32)
        seen = []
        for mode in (cfg.ScaleCalculationMode.FLOOR, cfg.ScaleCalculationMode.RCEIL):
            codes, data = mx.to_mx(x, torch.float8_e4m3fn, MX_BLOCK, scaling_mode=mode)
            got = float(data.to(torch.float32).flatten()[0]) * 2.0 ** (int(codes.view(torch.uint8).flatten()[0]) - 127)
            seen.append((mode.value, got))
        present = any(got != value for _, got in seen)
        return present, f"element {value!r} decodes to " + ", ".join(f"{g!r} ({m})" for m, g in seen)
    if issue_id == "torchao-nvfp4-tiny-tensor-reciprocal-overflow":
        nv = import_third_party("torchao.prototype.mx_formats.nvfp4_tensor")
        x = torch.zeros(1, 32)
        x[0, 0] = 2.0**-119  # tensor amax: per-tensor scale 2^-119 / 2688 < 2^-128
        t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=nv.per_tensor_amax_to_scale(x.abs().max()))
        wrong = int((t.dequantize(torch.float32)[0, 1:] != 0).sum())
        return wrong > 0, f"31 zeros beside 2^-119 dequantise to {wrong} nonzero values"
    raise KeyError(issue_id)


@pytest.mark.parametrize("issue_id", sorted(known_issues.KNOWN_ISSUES))
def test_registered_block_scaled_findings_match_what_this_torchao_does(issue_id, amp_torchao, amp_record):
    issue = known_issues.KNOWN_ISSUES[issue_id]
    present, seen = _observe(issue_id)
    amp_record.require_registry(
        issue, present, f"{known_issues.WHERE} ({issue_id!r})", seen=seen, version=torchao_version()
    )
