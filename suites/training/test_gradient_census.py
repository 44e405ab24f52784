"""Claim family: why fp16 needs loss scaling, measured (Micikevicius et al., 2018, Fig. 3).

For the tiny language model: the fp32 gradient magnitudes; the share fp16 would flush to zero
(below 2^-25) or hold as subnormals (below 2^-14); per loss scale 2^0 .. 2^24 the share recovered
and the share that overflows. One report row per bucket; checked for consistency with what
GradScaler does at those scales.
"""

from __future__ import annotations

import pytest

from harness.domains.engines import training as T
from harness.domains.training import census as C
from harness.domains.training import repro as training_repro

pytestmark = pytest.mark.amp_capability("training parity")


def test_gradient_census_of_the_language_model_is_recorded_and_consistent(amp_device, amp_record):
    census = C.gradient_census(C.lm_gradients())
    amp_record(
        "lm.grad.underflow_share",
        census["underflow_share"],
        unit="share",
        dtype="float16",
        device=amp_device,
        note="fp32 gradient values below half fp16's smallest subnormal (flushed to zero in fp16)",
    )
    amp_record("lm.grad.subnormal_share", census["subnormal_share"], unit="share", dtype="float16", device=amp_device)
    for q, v in census["log2_quantiles"].items():
        amp_record(f"lm.grad.log2_quantile_{q}", v, unit="log2", device=amp_device)
    for row in census["per_scale"]:
        for k in ("underflow_share", "recovered_share", "overflow_share"):
            amp_record(
                f"lm.grad.scale_2^{row['scale_log2']}.{k}",
                row[k],
                unit="share",
                dtype="float16",
                device=amp_device,
                tags={"scale_log2": row["scale_log2"]},
            )
    per = census["per_scale"]
    amp_record.require_all(
        C.census_claims(census),
        dtype="float16",
        device=amp_device,
    )
    first_over = next((2.0 ** r["scale_log2"] for r in per if r["overflow_share"] > 0), None)
    if first_over is not None:  # the scaler must skip where scaled parameter gradients overflow fp16
        setup = T.SETUPS["tiny_lm"]
        skipped = C.scaler_skips_at(setup, first_over, device=amp_device)  # the census's weights and batch
        amp_record.require(
            C.scaler_skip_claim(skipped, first_over),
            device=amp_device,
            tags={"scale": first_over},
            repro=None if skipped else training_repro.census_skip_repro_of(setup, first_over, 0, amp_device),
        )
