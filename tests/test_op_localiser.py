"""The op localiser names the op a fault is in: a kernel regression in one aten op (gelu keeping 3
significand bits) in the middle of the tiny LM and the MLP is named at that op, with its module, by
the op check of the training suite, by a failing training check's message, and by `amp-harness diff`
between a clean and a faulty run; two clean runs part nowhere."""

from __future__ import annotations

import json

import pytest
import torch
from faults.training import lossy_gelu_kernel
from helpers import assert_caught, inject, run_inner

from harness.apps import diff as df
from harness.domains import op_prints as P
from harness.domains.engines import training as T
from harness.domains.engines.training import diagnosis as O
from harness.domains.training.repro import op_repro_of
from harness.storage import report as rp

SUITE = "training/test_op_fingerprints.py"
CHECK = "test_every_op_of_an_amp_step_stays_within_its_budget_of_float64"
GELU_IN_THE_LM = "op #37 aten.gelu in blocks.0.ff.1"


def _inner(pytester, suite_copy, faulty: bool, reports: str):
    suite_copy(SUITE, conftest=False)
    patches = {"harness.domains.engines.training.diagnosis.record_step": "faults.training.recording_under_lossy_gelu"}
    inject(pytester, "training", patches=patches if faulty else None)
    return run_inner(pytester, f"--amp-report-dir={reports}")


def test_a_faulty_op_fails_the_op_check_and_diff_names_it(pytester, suite_copy):
    clean = _inner(pytester, suite_copy, False, "clean")
    assert not clean.failed, clean.text()
    faulty = _inner(pytester, suite_copy, True, "faulty")
    assert_caught(faulty, *(f"*::{CHECK}[[]cpu-{c}]" for c in ("mlp-bf16", "mlp-fp16+scaler", "tiny_lm-bf16")))
    faulty.stdout.fnmatch_lines([f"*first op over its budget: {GELU_IN_THE_LM} -> bfloat16*"], consecutive=False)
    a = df.Side("A", rp.load(rp.find_runs(pytester.path / "clean")[-1]))
    b = df.Side("B", rp.load(rp.find_runs(pytester.path / "faulty")[-1]))
    changes = {c.name: c for c in df.diff(a, b).changes if c.kind == "ops"}
    lm = changes["tiny_lm.bf16.op_fingerprint cpu"]
    assert lm.status is df.Status.CHANGED and lm.detail == f"first op whose output changed: {GELU_IN_THE_LM}", lm
    assert changes["cnn_bn.bf16.op_fingerprint cpu"].status is df.Status.UNCHANGED  # no gelu there
    same = df.diff(a, df.Side("A again", rp.load(rp.find_runs(pytester.path / "clean")[-1])))
    assert all(c.status is df.Status.UNCHANGED for c in same.changes if c.kind == "ops")


def test_a_failing_training_check_names_the_faulty_op(training_checks):
    """The MLP with the faulty gelu fails its AMP lane; the message and the typed result say where."""
    from harness.api import TrainingCheckFailed

    with lossy_gelu_kernel(), pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check(T.SETUPS["mlp"], [T.BF16], seeds=3, determinism=False, census=False, power=False)
    message = str(failed.value)
    assert "first op over its budget (of 56): op #5 aten.gelu in 1 -> bfloat16[64, 64]" in message, message
    rows = [r for r in training_checks.rows if r.metric == "mlp.bf16.lane.first_op_over_budget"]
    assert len(rows) == 1 and '"op": "aten.gelu"' in rows[0].tags
    # and it keeps the op's call for `amp-harness repro`: aten.gelu alone, on the inputs it saw
    repro = json.loads(rows[0].tags)["repro"]
    assert repro["code"].startswith("got = torch.ops.aten.gelu.default(t0)") and repro["tensors"]["t0"][0] == "bfloat16"
    assert repro["attachment"] in training_checks.attachments


def test_first_difference_names_the_first_op_that_parts():
    def op(i: int, digest: str) -> P.OpPrint:
        return P.OpPrint(i, "mm", "m", "bfloat16", (2, 2), digest, None)

    a, b = [op(0, "x"), op(1, "y"), op(2, "z")], [op(0, "x"), op(1, "Y"), op(2, "z")]
    assert P.first_difference(a, a) is None
    assert P.first_difference(a, b) == (a[1], b[1])
    assert P.first_difference(a, a[:2]) == (a[2], None)


class _Float8Activation(torch.nn.Module):
    """A "fast" activation storing its output through float8 under autocast only: every cast is
    correctly rounded, yet the bf16 step keeps 3 significand bits there."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.gelu(x)
        return y.to(torch.float8_e4m3fn).to(y.dtype) if torch.is_autocast_enabled("cpu") else y


def _step_ops(floor: torch.dtype | None, activation: torch.nn.Module) -> list[P.OpPrint]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), activation, torch.nn.Linear(64, 8))
    x = torch.randn(64, 32)

    def step() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(x).float().square().mean()

    return O.record_step(model, step, floor)


def test_a_cast_to_a_format_narrower_than_the_recipe_is_named_in_u_of_the_recipe():
    first = O.first_over_budget(_step_ops(torch.bfloat16, _Float8Activation()))
    assert first is not None and (first.op, first.module, first.dtype, first.unit) == (
        "_to_copy",
        "1",
        "float8_e4m3fn",
        "bfloat16",
    ), first
    assert "(the recipe's dtype; float8_e4m3fn is narrower)" in first.describe(), first.describe()
    # its script judges the cast against its input, in u of bf16
    repro = op_repro_of(first)
    assert repro is not None and "ref = t0.double()" in repro.code and "unit roundoff of bfloat16" in repro.code
    # negative controls: judged in its own format the forward cast is one correct rounding (the
    # backward's gradient cast flushes to zero, a loss even in float8's own unit); without the
    # activation the bf16 step's casts all stay within budget
    own = [o for o in _step_ops(None, _Float8Activation()) if o.module == "1" and o.cast]
    assert own and not any(o.over_budget for o in own), own
    clean = _step_ops(torch.bfloat16, torch.nn.GELU())
    casts = [o for o in clean if o.cast]
    assert casts and O.first_over_budget(clean) is None and max(o.error_u or 0.0 for o in casts) <= 1.0
