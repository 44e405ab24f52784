"""A failed memory check keeps a script that counts what the check counts.

The scripts are source text beside ``suites/memory/test_memory.py`` and
:mod:`harness.domains.memory.accounting`, so they are held to them here, on the clean stack:
the saved-activation script's fp32 and autocast byte counts equal
:func:`~harness.domains.memory.accounting.saved_activation_bytes` of the suite's forward pass
exactly, and each recipe's model-state script holds exactly the analytic model's bytes, as the
check requires. The negative controls (a faulty stack failing each check, its script exiting 1)
are in ``tests/test_failure_repro.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from harness.domains.engines import training as T
from harness.domains.memory import accounting as mem
from harness.domains.memory import repro as memory_repro

LM = T.SETUPS["tiny_lm"]
CPU = torch.device("cpu")


def _batch():
    return LM.batch(0, torch.Generator().manual_seed(0))


def _run(repro) -> dict:
    """The script's code executed here (its inputs as the script defines them), its globals back."""
    namespace = {"torch": torch, "math": math, "F": F, **repro.tensors}
    exec(compile(repro.code, "<memory script>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_activation_script_counts_the_bytes_the_check_counts(dtype):
    def forward(low):
        model = LM.model(0)
        x, y = _batch()

        def step():
            with torch.autocast("cpu", dtype=low or torch.bfloat16, enabled=low is not None):
                return LM.loss_from(LM.forward(model, x), y)

        return step

    ran = _run(memory_repro.activation_repro_of(LM, 0, _batch(), dtype, CPU))
    assert ran["fp32"] == mem.saved_activation_bytes(forward(None))
    assert ran["amp"] == mem.saved_activation_bytes(forward(dtype))
    assert ran["measured"] <= ran["allowed"]  # the clean stack passes, as the check does


@pytest.mark.parametrize(
    ("recipe", "model"),
    [("fp32", mem.FP32_ADAM), ("autocast", mem.AUTOCAST_ADAM), ("master_weights", mem.MASTER_WEIGHTS_ADAM)],
)
def test_each_model_state_script_holds_the_analytic_bytes_on_the_clean_stack(recipe, model):
    ran = _run(memory_repro.state_repro_of(LM, 0, _batch(), recipe, model, CPU))
    assert ran["held"] == ran["expected"] == model.total(sum(p.numel() for p in LM.model(0).parameters()))
