"""Claim family: float8 all-gather under FSDP2 changes nothing.

torchao's ``enable_fsdp_float8_all_gather`` gathers each sharded weight in float8, cast with the
whole weight's amax (all-reduced across ranks), so the gathered weight is the one the forward would
have cast itself: torchao promises identical numerics. Two ranks (gloo on the CPU, with torchao's
emulated matmul; NCCL on 2+ GPUs) train the same float8 MLP under FSDP2 without and with it
(``harness/domains/fp8/allgather.py``); losses and final weights must be identical.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.engines.ranks import ranks as dist_h
from harness.domains.fp8 import allgather
from harness.domains.fp8 import repro as fp8_repro
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("fp8")

#: ranks of the all-gather check (gloo on the CPU), and its steps
WORLD, ALL_GATHER_STEPS = 2, 4


def test_float8_all_gather_under_fsdp2_trains_bit_for_bit_as_without_it(
    amp_torchao, float8_fsdp_shard, amp_device, amp_record
):
    """torchao casts each weight shard to float8 before FSDP2 gathers it, with the whole weight's
    amax (all-reduced), so the gathered weight is the one the forward would have cast: the losses
    and the final weights must be identical with and without it (exact: no rounding differs)."""
    if amp_device.type == "cuda" and torch.cuda.device_count() < WORLD:
        pytest.skip(f"float8 all-gather needs {WORLD} GPUs for NCCL ranks; {torch.cuda.device_count()} here")
    ranks = dist_h.launch(
        allgather.float8_fsdp2_training,
        world=WORLD,
        steps=ALL_GATHER_STEPS,
        emulate=amp_device.type == "cpu",
        shard=float8_fsdp_shard,
    )
    plain, gathered = ranks[0]["plain"]["losses"], ranks[0]["all_gather"]["losses"]
    loss_diff = max(abs(a - b) for a, b in zip(plain, gathered, strict=True))
    weight_diff = max(
        abs(a - b)
        for r in ranks
        for sa, sb in zip(r["plain"]["shards"], r["all_gather"]["shards"], strict=True)
        for a, b in zip(sa, sb, strict=True)
    )
    amp_record.require_all(
        [
            compare_claim(
                "fsdp2.float8_all_gather.max_loss_diff",
                loss_diff,
                loss_diff == 0.0,
                f"the mean loss of each of {ALL_GATHER_STEPS} steps identical with and without float8 all-gather",
                detail=f"losses without {plain}; with {gathered}",
                expected=0.0,
                allowance=0.0,
            ),
            compare_claim(
                "fsdp2.float8_all_gather.max_weight_diff",
                weight_diff,
                weight_diff == 0.0,
                "every rank's final weight shards identical with and without float8 all-gather",
                detail=f"largest difference of a final weight element: {weight_diff!r}",
                expected=0.0,
                allowance=0.0,
            ),
        ],
        device=amp_device,
        tags={"world": WORLD, "shard": float8_fsdp_shard, "emulated_matmul": amp_device.type == "cpu"},
        # a failure keeps a script forking two gloo ranks (an NCCL run keeps none)
        # (one script: on the loss row, or on the weight row where only the weights differ)
        repro_of=lambda result: (
            None
            if amp_device.type != "cpu" or (loss_diff != 0.0 and not result.name.endswith("max_loss_diff"))
            else fp8_repro.float8_all_gather(
                "float8 all-gather under FSDP2 against the same training without it",
                WORLD,
                float8_fsdp_shard,
                ALL_GATHER_STEPS,
                emulate=True,
            )
        ),
    )
