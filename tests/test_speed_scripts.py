"""A failed speed check's script times what the check timed.

The harness builds each eager workload from source text (``harness/domains/speed/workloads.py``)
and the script carries that text, so the step is one text; what differs is how the names it reads
are defined: objects in the harness, source text and saved tensors in the script (the tiny LM's
model and loss, its batch). Held together here: the script's definitions and the workload's text,
run twice each way, give bitwise the same results as the harness's workload. The negative control
(a slowed autocast matmul failing the check, its script exiting 1) is in
``tests/test_speed_and_qualify.py``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.domains.speed.workloads import WORKLOADS

SCRIPTED = sorted(name for name, w in WORKLOADS.items() if w.script is not None)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a is None and b is None


def test_every_eager_workload_has_a_script():
    assert sorted(WORKLOADS) == SCRIPTED, "a workload without a script: its failure keeps none"


#: bf16 where the CPU emulates it (AVX2 kernels) is the slowest cell by far: thorough there
BF16 = pytest.param(torch.bfloat16, id="bf16", marks=pytest.mark.amp_thorough_where_emulated("bf16"))


@pytest.mark.standalone_scripts
@pytest.mark.parametrize("name", SCRIPTED)
@pytest.mark.parametrize("dtype", [pytest.param(None, id="fp32"), BF16])
def test_the_script_runs_what_the_harness_times(name, dtype):
    workload = WORKLOADS[name]
    assert workload.script is not None
    defined = workload.script.prelude()
    assert defined is not None
    text, tensors = defined
    namespace = {"torch": torch, "F": F, **tensors}
    exec(compile(text + "\n\n" + workload.script.source, f"<{name} script>", "exec"), namespace)
    cpu = torch.device("cpu")
    harness_run, script_run = workload.make(cpu, dtype), namespace["make"](cpu, dtype)
    for _ in range(2):  # a training step's second call starts from its first one's update
        assert _same(harness_run(), script_run())
