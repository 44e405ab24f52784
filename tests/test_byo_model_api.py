"""The bring-your-own-model API takes real models as they are, never passes a check that tested
nothing, and names the module where a failing AMP run departs from fp32."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from harness.api import TrainingResult, VerdictKind
from harness.domains.engines import training as T
from harness.domains.engines.training.recipes import Inputs, call, logits_of, loss_of, split
from harness.numerics.verdict import Outcome


# -- outputs and batches of any structure ---------------------------------------------------------
@pytest.mark.parametrize(
    "output",
    [
        torch.ones(2),
        (torch.ones(2), torch.zeros(1)),
        [torch.ones(2)],
        {"logits": torch.ones(2), "hidden": torch.zeros(3)},
        SimpleNamespace(logits=torch.ones(2), loss=torch.tensor(0.5)),
    ],
    ids=["tensor", "tuple", "list", "dict", "object"],
)
def test_the_output_tensor_is_found_in_tensors_tuples_dicts_and_objects(output):
    assert torch.equal(logits_of(output), torch.ones(2))


def test_an_output_without_a_tensor_is_an_error_naming_its_type_and_the_remedy():
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"type Opaque.*`output=` function"):
        logits_of(Opaque())


def test_a_model_loss_is_read_from_loss_and_its_absence_says_what_to_do():
    assert float(loss_of({"loss": torch.tensor(2.0)})) == 2.0
    assert float(loss_of(SimpleNamespace(loss=torch.tensor(3.0)))) == 3.0
    with pytest.raises(TypeError, match="Pass the labels in the batch inputs, or give the Setup a loss function"):
        loss_of({"logits": torch.ones(2)})


def test_inputs_are_passed_positionally_by_keyword_or_both():
    class Probe(nn.Module):
        def forward(self, a, b=None, *, c=None):
            return (a, b, c)

    m, x = Probe(), torch.ones(1)
    assert call(m, x) == (x, None, None)
    assert call(m, (x, x)) == (x, x, None)
    assert call(m, {"a": x, "c": x}) == (x, None, x)
    assert call(m, Inputs((x,), {"c": x})) == (x, None, x)
    with pytest.raises(TypeError, match="cannot be passed to a model"):
        call(m, 3)


def test_structured_batches_split_into_micro_batches_and_refuse_unequal_sizes():
    batch = {"input_ids": torch.arange(8).reshape(4, 2), "mask": torch.ones(4, 2)}
    parts = split(batch, 2)
    assert [p["input_ids"].shape[0] for p in parts] == [2, 2]
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), batch["input_ids"])
    with pytest.raises(ValueError, match="different batch sizes"):
        split({"a": torch.ones(4), "b": torch.ones(3)}, 2)


# -- optimizers: names, factories, weight decay, schedules ------------------------------------
def _setup(**kw):
    mlp = T.SETUPS["mlp"]
    return T.Setup("mlp_variant", mlp.model, mlp.batch, mlp.loss, steps=6, lr=1e-2, **kw)


def test_an_unknown_optimizer_name_is_refused_never_silently_adamw():
    with pytest.raises(ValueError, match=r"unknown optimizer 'lion'.*sgd, adamw, adam.*or pass a factory"):
        _setup(optimizer="lion")


def test_an_optimizer_factory_weight_decay_and_a_schedule_are_used():
    built = []

    def factory(params, lr):
        opt = torch.optim.SGD(params, lr=lr)
        built.append(opt)
        return opt

    steps = 6
    setup = _setup(optimizer=factory, schedule=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5))
    T.train(setup, T.FP32)
    assert len(built) == 1
    assert built[0].param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5**steps)
    decayed = T.train(_setup(optimizer="adamw", weight_decay=0.5), T.FP32)
    plain = T.train(_setup(optimizer="adamw"), T.FP32)
    assert decayed.losses != plain.losses, "weight_decay did not reach the named optimizer"


def test_recipe_names_become_metric_safe_identifiers():
    assert T.FP16_NO_SCALER.metric_id == "fp16_without_loss_scaling"
    assert T.FP16_STATIC_FP32_ACCUM.metric_id == "fp16+static_scale_fp32_accumulation_small_gradients"


# -- no vacuous passes ----------------------------------------------------------------------------
#: A model whose outputs are 4x a linear map: at GradScaler's initial 2^16 its fp16 gradients overflow until
#: the scale has backed off enough (the ResNet-18 case: all of 4 steps skipped, 65536 -> 4096).
#: Source text, so that the pytester run below defines exactly the same setup.
LOUD = """
import torch
from torch import nn
from harness.domains.engines import training as T


class Loud(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 1)

    def forward(self, x):
        return self.lin(x) * 4.0


def _loud(seed):
    torch.manual_seed(seed)
    return Loud()


def _regression(step, gen):
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(-1, keepdim=True)


def loud_setup(steps, lr=1e-4):
    return T.Setup("loud", _loud, _regression, nn.functional.mse_loss, steps=steps, lr=lr, checkpoint_every=2)
"""
_ns: dict[str, object] = {}
exec(LOUD, _ns)
loud_setup = _ns["loud_setup"]

INCONCLUSIVE_TEST = (
    LOUD
    + """
import pytest

pytestmark = pytest.mark.amp_capability("training parity")


def test_all_steps_skipped(amp_training):
    amp_training.check(loud_setup(4), [T.FP16_SCALER], determinism=False, census=False)
"""
)


def test_a_recipe_whose_steps_were_all_skipped_is_inconclusive_never_pass(pytester, tmp_path):
    from harness.apps import qualify

    pytester.makepyfile(test_inconclusive=INCONCLUSIVE_TEST)
    reports = tmp_path / "reports"
    result = pytester.runpytest(
        f"--amp-report-dir={reports}", f"--junitxml={tmp_path / 'junit.xml'}", "-p", "no:cacheprovider"
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "INCONCLUSIVE" in out and "4 of 4 optimizer steps skipped (loss scale 65536 -> 4096)" in out, out[-2500:]
    from harness.storage import report as rp

    run = rp.load(rp.find_runs(reports)[-1])
    rows = run.rows[run.rows["metric"].str.endswith("taken_steps")]
    assert rows["outcome"].tolist() == ["inconclusive"] and rows["value"].tolist() == [0.0]
    (verdict,) = [v for v in qualify.verdicts(tmp_path / "junit.xml") if v.capability == "training parity"]
    assert verdict.status is qualify.Outcome.INCONCLUSIVE, verdict


def test_the_same_model_trained_long_enough_is_judged():
    report = T.check_parity(loud_setup(16), [T.FP16_SCALER])
    (r,) = report.results
    assert T.conclusive("loud", r) is None, (r.run.taken_steps, r.reference.param_change)


def test_a_run_whose_weights_did_not_move_is_inconclusive():
    (r,) = T.check_parity(loud_setup(4, lr=0.0), [T.BF16]).results
    verdict = T.judge("loud", r)
    assert verdict.outcome.value == "inconclusive" and "parameters moved 0" in "\n".join(verdict.detail)


# -- diagnosis ------------------------------------------------------------------------------------
class Fragile(nn.Module):
    """Numerically fragile in low precision: shifts its input by 64 and back. In bf16 the shift
    leaves a resolution of 0.5 (bf16 spacing in [64, 128)), destroying values of order 1."""

    def forward(self, x):
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return (x + 64.0) - 64.0


class WithFragile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.act = nn.Linear(16, 64), nn.GELU()
        self.fragile = Fragile()
        self.out = nn.Linear(64, 1)

    def forward(self, x):
        return self.out(self.fragile(self.act(self.inp(x)))).float()


def _with_fragile(seed):
    torch.manual_seed(seed)
    return WithFragile()


def test_a_parity_failure_names_the_module_where_amp_departs_and_tries_the_remedy(training_checks):
    mlp = T.SETUPS["mlp"]
    setup = T.Setup("fragile_mlp", _with_fragile, mlp.batch, mlp.loss, steps=mlp.steps, lr=mlp.lr)
    checks = training_checks
    with pytest.raises(AssertionError) as failed:
        checks.check(setup, [T.BF16], determinism=False, census=False)
    message = str(failed.value)
    assert "the AMP run departs at fragile (Fragile)" in message, message
    assert "remedy tried: fragile outside autocast" in message and "(passes)" in message, message


def test_the_resnet18_example_trains_through_the_api_as_it_is():
    """The ResNet-18 finding of docs/writing-checks.md runs on this example; keep it working (one
    step: where bf16 is emulated each ResNet step takes over a second)."""
    import dataclasses

    from examples.models.resnet18 import RESNET18_SETUP

    run = T.train(dataclasses.replace(RESNET18_SETUP, steps=1, checkpoint_every=1), T.BF16)
    assert run.taken_steps == 1 and all(map(torch.isfinite, torch.tensor(run.losses)))


class InlineNormBlock(nn.Module):
    """A residual block whose RMS normalisation is written inline in ``forward``: with ``loud`` its
    activations reach |z| ~ 600, whose square overflows fp16 (65504) before the mean is taken."""

    def __init__(self, width: int, loud: bool) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(width, width), nn.Linear(width, width)
        self.gain = 600.0 if loud else 1.0

    def forward(self, x):
        z = self.lin1(x) * self.gain
        energy = z.pow(2).mean(-1, keepdim=True)  # the inline overflow: no module of its own
        return x + self.lin2(z / (energy + 1e-6).sqrt())


class ThreeBlocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.Sequential(*(InlineNormBlock(32, loud=i == 1) for i in range(3)))
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x))).float()


def _three_blocks(seed):
    torch.manual_seed(seed)
    return ThreeBlocks()


def test_an_overflow_written_inline_in_a_container_is_found_in_that_container(training_checks):
    """The departure is the container whose own forward overflows (blocks.1), not the next module
    with parameters, and the remedy tried there (that block outside autocast) passes."""
    mlp = T.SETUPS["mlp"]
    setup = T.Setup("inline_overflow", _three_blocks, mlp.batch, mlp.loss, steps=20, lr=mlp.lr, checkpoint_every=10)
    with pytest.raises(AssertionError) as failed:
        training_checks.check(setup, [T.FP16_SCALER], seeds=3, determinism=False, census=False, power=False)
    message = str(failed.value)
    assert "the AMP run departs at blocks.1 (InlineNormBlock)" in message, message
    assert "remedy tried: blocks.1 outside autocast" in message and "(passes)" in message, message


# -- no vacuous calls -----------------------------------------------------------------------------
def _untrainable(seed):
    raise AssertionError("a refused call must not build a model")


UNTRAINED = T.Setup("untrained", _untrainable, T.SETUPS["mlp"].batch, T.SETUPS["mlp"].loss, steps=20, lr=1e-3)


@pytest.mark.parametrize(
    ("recipes", "seeds", "error", "match"),
    [
        ([], 5, ValueError, r"no recipes to check.*pass some of .*BF16"),
        (["bf16"], 5, TypeError, r"not a recipe: 'bf16'.*Recipe objects from harness.api"),
        ([None], 5, TypeError, r"not a recipe: None"),
        (T.BF16, 5, TypeError, r"recipes must be a list of Recipe objects, got Recipe"),
        ([T.FP32], 5, ValueError, r"run in fp32: fp32 is the reference"),
        ([T.BF16], 0, ValueError, r"seeds=0: the parity band .* needs at least 2"),
        ([T.BF16], 1, ValueError, r"seeds=1"),
    ],
    ids=["empty", "string", "none", "not-a-list", "fp32", "seeds-0", "seeds-1"],
)
def test_a_vacuous_call_is_refused_before_anything_trains(training_checks, recipes, seeds, error, match):
    with pytest.raises(error, match=match):
        training_checks.check(UNTRAINED, recipes, seeds=seeds)


def test_too_few_checkpoints_for_a_verdict_are_refused_before_anything_trains(training_checks):
    short = T.Setup("short", _untrainable, UNTRAINED.batch, UNTRAINED.loss, steps=4, lr=1e-3, checkpoint_every=5)
    with pytest.raises(ValueError, match=r"steps=4 with checkpoint_every=5 gives 1 evaluation checkpoint.*at least 10"):
        training_checks.check(short, [T.BF16])


# -- overflow handling on the user's own optimizer and scaler ---------------------------------------
class ScalingAwareSGD(torch.optim.Optimizer):
    """A user's optimizer that handles loss scaling itself (``_step_supports_amp_scaling``): it
    reads GradScaler's ``grad_scale`` and ``found_inf`` and unscales inside its step, as a fused
    kernel does. ``honours_found_inf=False`` is the fault: it steps on an overflow."""

    _step_supports_amp_scaling = True

    def __init__(self, params, lr, honours_found_inf=True):
        super().__init__(params, {"lr": lr})
        self.honours_found_inf = honours_found_inf

    @torch.no_grad()
    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        if self.honours_found_inf and found_inf is not None and float(found_inf) > 0:
            return None
        grad_scale = getattr(self, "grad_scale", None)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad if grad_scale is None else p.grad / grad_scale
                state = self.state[p]
                state["step"] = state.get("step", torch.zeros(())) + 1
                p.add_(g, alpha=-group["lr"])
        return None


def _with_optimizer(factory):
    import dataclasses

    return dataclasses.replace(T.SETUPS["mlp"], name="mlp_user_optimizer", optimizer=factory)


def _overflow_rows(checks):
    return [r for r in checks.rows if ".overflow_step_" in r.metric]


def _cheap_check(checks, setup, recipes):
    return checks.check(setup, recipes, seeds=2, lane=False, power=False, determinism=False, census=False)


@pytest.mark.parametrize(
    "factory",
    [
        lambda ps, lr: torch.optim.AdamW(ps, lr=lr, fused=True),
        lambda ps, lr: torch.optim.AdamW(ps, lr=lr, foreach=True),
        lambda ps, lr: ScalingAwareSGD(ps, lr),
    ],
    ids=["fused-AdamW", "foreach-AdamW", "own-optimizer-with-amp-scaling"],
)
def test_a_users_optimizer_shows_its_overflow_handling_in_rows(training_checks, factory):
    """Every recipe with a scaler gets a planted +inf, NaN and -inf at checkpoint steps: a row per
    step, each passing where parameters and state stay untouched and the scale backs off."""
    result = _cheap_check(training_checks, _with_optimizer(factory), [T.FP16_SCALER, T.CLIP])
    assert isinstance(result, TrainingResult) and result.outcome is Outcome.PASS
    assert {v.kind for v in result.verdicts} == {
        VerdictKind.PARITY,
        VerdictKind.CLIPPING,
        VerdictKind.OVERFLOW,
        VerdictKind.MODULE_LANE,
    }
    assert len(result.of(VerdictKind.OVERFLOW, "fp16+scaler+clip")) == 3
    rows = _overflow_rows(training_checks)
    assert len(rows) == 6 and all(r.outcome is Outcome.PASS for r in rows), rows
    assert {json.loads(r.tags)["planted"] for r in rows} == {"+inf", "NaN", "-inf"}


def test_a_users_optimizer_that_ignores_found_inf_fails_only_the_overflow_rows(training_checks):
    """The negative control: an optimizer declaring ``_step_supports_amp_scaling`` that steps on an
    overflow. Parity (no overflow in the clean runs) passes; every planted step fails, naming the
    parameters it changed."""
    setup = _with_optimizer(lambda ps, lr: ScalingAwareSGD(ps, lr, honours_found_inf=False))
    with pytest.raises(AssertionError) as failed:
        _cheap_check(training_checks, setup, [T.FP16_SCALER])
    message = str(failed.value)
    assert "mlp_user_optimizer.fp16+scaler.overflow_step_9: FAILED" in message, message
    assert "changed parameter 0.weight" in message, message
    failed_rows = {r.metric for r in training_checks.rows if r.outcome is Outcome.FAIL}
    assert failed_rows == {f"mlp_user_optimizer.fp16+scaler.overflow_step_{t}" for t in (9, 39, 59)}, failed_rows
    # the error carries the typed result: the same verdicts, no message to parse
    result = failed.value.result
    assert result.outcome is Outcome.FAIL
    assert {v.name for v in result.failures} == failed_rows
    assert {v.kind for v in result.failures} == {VerdictKind.OVERFLOW}
    assert [v.outcome for v in result.of(VerdictKind.PARITY)] == [Outcome.PASS]


def test_a_users_scaler_that_never_backs_off_fails_the_overflow_rows(training_checks):
    """``Setup(scaler=...)`` is the user's own scaler; one that skips the step but keeps its scale
    fails every planted step, saying what the scale did."""
    import dataclasses

    import faults.scaler as broken

    setup = dataclasses.replace(T.SETUPS["mlp"], name="mlp_user_scaler", scaler=broken.NeverBacksOff)
    with pytest.raises(AssertionError) as failed:
        _cheap_check(training_checks, setup, [T.FP16_SCALER])
    assert "the scale went 65536 -> 65536, expected x 0.5 = 32768" in str(failed.value), str(failed.value)


def test_a_clipping_recipe_whose_clip_never_binds_is_inconclusive(training_checks):
    """A recipe that claims clipping must have clipped: a max norm above every step's gradient norm
    tested nothing clipping does, and says so with the norms it saw."""
    never = T.Recipe("fp16+scaler+clip(1e6)", dtype=torch.float16, scaler=True, clip=1e6)
    with pytest.raises(AssertionError) as failed:
        _cheap_check(training_checks, T.SETUPS["mlp"], [never])
    message = str(failed.value)
    assert "mlp.fp16+scaler+clip_1e6.clip_binding_steps: INCONCLUSIVE" in message, message
    assert "clipping bound on 0 of" in message, message
    binding = [r for r in training_checks.rows if r.metric.endswith("clip_binding_steps")]
    assert [r.outcome for r in binding] == [Outcome.INCONCLUSIVE]


# -- resume mid-run (resume_at) -------------------------------------------------------------------
def _with_scaler(name, scaler):
    import dataclasses

    return dataclasses.replace(T.SETUPS["mlp"], name=name, scaler=scaler)


def test_a_run_resumed_mid_run_continues_bit_for_bit_as_a_row(training_checks):
    import faults.scaler as scalers

    setup = _with_scaler("mlp_resumed", scalers.GrowsEveryOtherStep)
    result = training_checks.check(
        setup, [T.FP16_SCALER], seeds=2, lane=False, power=False, determinism=False, census=False, overflow=False,
        resume_at=30,
    )  # fmt: skip
    assert [v.outcome for v in result.of(VerdictKind.RESUME)] == [Outcome.PASS]
    moved = [r for r in training_checks.rows if r.metric.endswith(".resume_scale_moved")]
    assert moved and moved[0].value, moved  # the scale had grown: the scaler's restore was tested


def test_a_scaler_whose_state_is_not_restored_fails_the_resume_row(training_checks):
    import faults.scaler as scalers

    setup = _with_scaler("mlp_resumed", scalers.StateNotRestored)
    with pytest.raises(AssertionError) as failed:
        training_checks.check(
            setup, [T.FP16_SCALER], seeds=2, lane=False, power=False, determinism=False, census=False,
            overflow=False, resume_at=30,
        )  # fmt: skip
    message = str(failed.value)
    assert "mlp_resumed.fp16+scaler.resume_differences: FAILED" in message, message
    assert (
        "resumed before step 30, it parts from the uninterrupted run: step 30: scale 65536.0, resumed 256.0" in message
    ), message
    assert {v.kind for v in failed.value.result.failures} == {VerdictKind.RESUME}


@pytest.mark.parametrize("at", [0, 60, -1])
def test_a_resume_step_outside_the_run_is_refused_before_anything_trains(training_checks, at):
    with pytest.raises(ValueError, match=rf"resume_at={at}: .* steps 1 to 59"):
        training_checks.check(T.SETUPS["mlp"], [T.BF16], resume_at=at)


# -- activation checkpointing in the user's model --------------------------------------------------
class _Checkpointed(nn.Module):
    """An input layer, two checkpointed residual blocks, a head; ``fp32_recompute``: the
    checkpointed function recomputes with autocast disabled (fairscale#1199's fault)."""

    def __init__(self, reentrant: bool, fp32_recompute: bool = False) -> None:
        super().__init__()
        self.inp = nn.Linear(32, 32)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32)) for _ in range(2))
        self.head = nn.Linear(32, 8)
        self.reentrant, self.fp32_recompute = reentrant, fp32_recompute

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        h = self.inp(x)
        for block in self.blocks:
            calls = [0]

            def run(t, block=block, calls=calls):
                calls[0] += 1
                if self.fp32_recompute and calls[0] > 1:
                    with torch.autocast(t.device.type, enabled=False):
                        return t + block(t.float())
                return t + block(t)

            # as Hugging Face models do: checkpoint only where a backward will recompute
            h = (
                checkpoint(run, h, use_reentrant=self.reentrant)
                if self.training and torch.is_grad_enabled()
                else run(h)
            )
        return self.head(h)


def _checkpointed_setup(reentrant, fp32_recompute=False, compiled=None):
    """``compiled``: "model" (``torch.compile(model)``) or "head" (a submodule compiled), with the
    AOTAutograd backend that runs the traced graphs (no C++ compile)."""

    def model(seed):
        torch.manual_seed(seed)
        m = _Checkpointed(reentrant, fp32_recompute)
        if compiled == "head":
            m.head = torch.compile(m.head, backend="aot_eager")
        return torch.compile(m, backend="aot_eager") if compiled == "model" else m

    def batch(step, gen):
        x = torch.randn(16, 32, generator=gen)
        return x, x[:, :8].tanh()

    return T.Setup("checkpointed", model, batch, nn.functional.mse_loss, steps=20, lr=1e-2)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_checkpointed_blocks_recomputing_in_their_forwards_dtypes_pass(training_checks, reentrant):
    result = _cheap_check(training_checks, _checkpointed_setup(reentrant), [T.BF16])
    [verdict] = result.of(VerdictKind.RECOMPUTE)
    assert verdict.outcome is Outcome.PASS


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_a_block_recomputed_in_another_precision_fails_naming_the_module(training_checks, reentrant):
    with pytest.raises(AssertionError) as failed:
        _cheap_check(training_checks, _checkpointed_setup(reentrant, fp32_recompute=True), [T.BF16])
    message = str(failed.value)
    assert "checkpointed.bf16.recompute_mismatches: FAILED" in message, message
    assert "blocks.1.0: forward bfloat16, recomputed float32" in message, message
    assert {v.kind for v in failed.value.result.failures} == {VerdictKind.RECOMPUTE}


# Dynamo, tracing a compiled submodule called on a non-leaf tensor, reads its .grad (torch's warning)
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
@pytest.mark.parametrize("compiled", ["model", "head"])
def test_a_compiled_checkpointed_model_is_judged_on_its_eager_modules_and_says_so(training_checks, compiled):
    """Module hooks see nothing of a compiled backward (and Dynamo failed tracing the observer's
    hooks: the check crashed); the recompute is observed with torch.compile set aside."""
    result = _cheap_check(training_checks, _checkpointed_setup(False, compiled=compiled), [T.BF16])
    [verdict] = result.of(VerdictKind.RECOMPUTE)
    assert verdict.outcome is Outcome.PASS
    [row] = [r for r in training_checks.rows if r.metric == "checkpointed.bf16.recompute_mismatches"]
    names = "the model" if compiled == "model" else "'head'"
    assert f"observed eager: {names} compiled with torch.compile" in row.note, row.note
    with pytest.raises(AssertionError) as failed:
        _cheap_check(training_checks, _checkpointed_setup(False, True, compiled=compiled), [T.BF16])
    assert "blocks.1.0: forward bfloat16, recomputed float32" in str(failed.value), str(failed.value)


def test_a_model_without_checkpointing_gets_a_row_and_no_verdict(training_checks):
    result = _cheap_check(training_checks, T.SETUPS["mlp"], [T.BF16])
    assert not result.of(VerdictKind.RECOMPUTE)
    assert any(r.metric == "mlp.bf16.recomputed_modules" and r.value == 0 for r in training_checks.rows)


# -- a custom fp32-only autograd function in the user's model --------------------------------------
class _Standardise(torch.autograd.Function):
    """x + 30 standardised with the one-pass variance E[x^2] - mean^2: the offset's detail survives
    only in fp32, so the function declares ``cast_inputs=torch.float32``."""

    @staticmethod
    def forward(ctx, x):
        x = x + 30.0
        mean = x.mean(-1, keepdim=True)
        inv = ((x * x).mean(-1, keepdim=True) - mean * mean).clamp_min(1e-6).rsqrt()
        ctx.save_for_backward(x - mean, inv)
        return (x - mean) * inv

    @staticmethod
    def backward(ctx, g):
        xc, inv = ctx.saved_tensors
        y = xc * inv
        return inv * (g - g.mean(-1, keepdim=True) - y * (g * y).mean(-1, keepdim=True))


def _custom_setup(cast: bool):
    class Fn(_Standardise):
        forward = staticmethod(
            torch.amp.custom_fwd(_Standardise.forward, device_type="cpu", cast_inputs=torch.float32 if cast else None)
        )
        backward = staticmethod(torch.amp.custom_bwd(_Standardise.backward, device_type="cpu"))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp, self.head = nn.Linear(32, 64), nn.Linear(64, 8)

        def forward(self, x):
            return self.head(Fn.apply(self.inp(x)))

    def model(seed):
        torch.manual_seed(seed)
        return Net()

    def batch(step, gen):
        x = torch.randn(32, 32, generator=gen)
        return x, x[:, :8].tanh()

    return T.Setup(
        f"custom_fp32_{'cast' if cast else 'uncast'}", model, batch, nn.functional.mse_loss, steps=20, lr=1e-2
    )


def test_a_custom_fp32_function_passes_and_fails_once_its_decorator_stops_casting(training_checks):
    _cheap_check(training_checks, _custom_setup(cast=True), [T.BF16])
    with pytest.raises(AssertionError, match=r"custom_fp32_uncast\.bf16\.worst_diff_over_allowance: FAILED"):
        _cheap_check(training_checks, _custom_setup(cast=False), [T.BF16])
