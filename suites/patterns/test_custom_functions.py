"""Custom autograd functions run in the precision their decorators promise.

``torch.amp.custom_fwd(cast_inputs=torch.float32)`` (an fp32-only kernel) runs the forward with
autocast disabled on fp32 inputs, and ``custom_bwd`` the backward under the forward's state: every
matmul of the function in fp32, forward and backward. Without ``cast_inputs`` the forward runs under
the caller's autocast, and so does the backward (``custom_bwd``): its matmuls in the autocast dtype.
Observed by a dispatch mode recording each ``aten.mm`` and its inputs' dtypes, not by the function."""

from __future__ import annotations

import pytest

from harness.domains.patterns import custom_functions as F
from harness.domains.patterns.repro import custom_function_repro
from harness.numerics.comparison import compare_claim

pytestmark = pytest.mark.amp_capability("autocast policy")


@pytest.mark.parametrize("kind", ["fp32", "autocast"])
def test_a_custom_functions_matmuls_run_in_the_precision_its_decorators_promise(
    kind, amp_device, amp_dtype, amp_record
):
    fn = F.functions(amp_device.type)[kind]
    seen = F.observe(fn, amp_device, amp_dtype)
    expected = "float32" if kind == "fp32" else str(amp_dtype).removeprefix("torch.")
    calls = [
        (phase, dtypes) for phase, calls in (("forward", seen.forward), ("backward", seen.backward)) for dtypes in calls
    ]
    wrong = [f"{phase} mm in {', '.join(d)}" for phase, d in calls if set(d) != {expected}]
    if seen.error:
        wrong.append(seen.error)
    if len(seen.forward) != 1 or len(seen.backward) != 2:
        wrong.append(
            f"{len(seen.forward)} forward and {len(seen.backward)} backward matmuls observed (1 and 2 expected)"
        )
    amp_record.require(
        compare_claim(
            f"custom_function.{kind}.matmuls_in_another_dtype",
            len(wrong),
            not wrong,
            f"every matmul of the custom function, forward and backward, runs in {expected}",
            detail=f"custom_fwd{'(cast_inputs=torch.float32)' if kind == 'fp32' else ''} under {amp_dtype} autocast: "
            + "; ".join(wrong),
            expected=0,
            allowance=0,
            unit="matmuls",
        ),
        device=amp_device,
        dtype=amp_dtype,
        tags={"kind": kind, "forward": [list(d) for d in seen.forward], "backward": [list(d) for d in seen.backward]},
        repro=custom_function_repro(amp_device, amp_dtype, kind),
    )
