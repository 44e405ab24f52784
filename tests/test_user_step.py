"""Your own training step as the unit (``amp_training.check_step``): a GAN step (two models, two
optimizers, two losses, one GradScaler) and a distillation step (a frozen bf16 teacher, a student
in AMP) pass clean; each rule fails its planted bug (an optimizer whose overflow is ignored, the
scaler bypassed, master weights dropped, the precision ignored, a nondeterministic step, a state
the resume loses); bad input is refused before anything trains."""

from __future__ import annotations

import contextlib
import functools
import itertools

import pytest
import torch
from torch import nn

from harness.api import BF16, CLIP, FP16_SCALER, FP32, TrainingCheckFailed, VerdictKind
from harness.domains.engines.training import module_lane as ML
from harness.domains.engines.training.recipes import Setup
from harness.numerics.comparison import explain
from harness.numerics.verdict import Outcome

STEPS, BATCH = 16, 32
bce = nn.BCEWithLogitsLoss()


# -- a GAN: two models, two optimizers, two losses, one GradScaler ------------------------------
def gan(seed: int) -> dict[str, object]:
    g = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 16))
    d = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    return {
        "gen": g,
        "disc": d,
        "opt_g": torch.optim.Adam(g.parameters(), 1e-3, betas=(0.5, 0.9)),
        "opt_d": torch.optim.Adam(d.parameters(), 1e-3, betas=(0.5, 0.9)),
    }


def gan_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1000 + seed)
    return [
        (torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 16, generator=gen) * 0.5 + 1) for _ in range(STEPS)
    ]


def gan_step(o, batch, precision, *, ignore_d_overflow=False, update_each=False):
    z, real = batch
    scaler = precision.scaler
    with precision.autocast():
        fake = o["gen"](z)
        d_loss = bce(o["disc"](real), torch.ones(BATCH, 1)) + bce(o["disc"](fake.detach()), torch.zeros(BATCH, 1))
    o["opt_d"].zero_grad()
    scaler.scale(d_loss).backward()
    if ignore_d_overflow:  # the bug: unscaled by hand, then stepped whatever the scaler found
        scaler.unscale_(o["opt_d"])
        o["opt_d"].step()
    else:
        scaler.step(o["opt_d"])
    if update_each:  # the bug: the scale updated after each optimizer, twice an iteration
        scaler.update()
    with precision.autocast():
        g_loss = bce(o["disc"](fake), torch.ones(BATCH, 1))
    o["opt_g"].zero_grad()
    scaler.scale(g_loss).backward()
    scaler.step(o["opt_g"])
    scaler.update()
    return {"d_loss": d_loss, "g_loss": g_loss}


def test_a_gan_step_passes_clean_with_every_loss_and_optimizer_judged(training_checks):
    result = training_checks.check_step(
        gan, gan_step, [BF16, FP16_SCALER], batches=gan_batches, name="gan", resume_at=8
    )
    assert result.outcome is Outcome.PASS
    parity = {v.name for v in result.of(VerdictKind.PARITY)}
    assert {n.split(".")[2] for n in parity} == {"d_loss", "g_loss"} and len(parity) == 4
    overflow = result.of(VerdictKind.OVERFLOW)
    assert sorted(v.name.rsplit(".", 1)[1] for v in overflow) == ["opt_d", "opt_g"]
    for kind in (VerdictKind.PRECISION, VerdictKind.MASTER_WEIGHTS, VerdictKind.MODULE_LANE, VerdictKind.RESUME):
        assert len(result.of(kind)) == 2, kind
    assert len(result.of(VerdictKind.SCALER_CONTRACT)) == 1  # fp16 + GradScaler; bf16 takes no scaler
    assert len(result.of(VerdictKind.DETERMINISM)) == 2


def test_a_gan_step_that_ignores_one_optimizers_overflow_fails_naming_that_optimizer(training_checks):
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(
            gan, functools.partial(gan_step, ignore_d_overflow=True), [FP16_SCALER], batches=gan_batches, name="gan"
        )
    failures = failed.value.result.failures
    assert [(v.kind, v.name) for v in failures] == [(VerdictKind.OVERFLOW, "gan.fp16+scaler.overflow.opt_d")]
    assert "opt_d changed its parameters or state on the step with a non-finite gradient" in str(failed.value)


def test_a_gan_step_that_updates_the_scale_after_each_optimizer_fails_the_scalers_contract(training_checks):
    """update() twice an iteration grows the scale twice as fast (and backs it off twice): the run
    still trains, parity and overflow pass, and the contract names the step and the calls."""
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(
            gan, functools.partial(gan_step, update_each=True), [FP16_SCALER], batches=gan_batches, name="gan",
            resume_at=8,
        )  # fmt: skip
    failures = failed.value.result.failures
    assert [(v.kind, v.name) for v in failures] == [(VerdictKind.SCALER_CONTRACT, "gan.fp16+scaler.scaler_contract")]
    assert "step 0: update() called 2 times in an iteration whose scaler stepped opt_d, opt_g" in str(failed.value)


def test_each_rule_of_the_scalers_contract_names_its_violation():
    """On recorded calls: unscale_ twice, unscale_ after step, step after update (not where its loss
    was scaled after that update), update twice naming its caller, no update, and a
    scale the reference state machine does not give; a clean sequence (growth after the interval,
    a back-off on a non-finite gradient) has none."""
    from harness.domains.training.step_checks import scaler_contract_violations as violations
    from harness.domains.training.user_step import ScalerCall as C
    from harness.domains.training.user_step import Trace

    rule = (2.0, 0.5, 2)

    def run(*steps):
        t = Trace(0, "fp16")
        t.scaler_calls = dict(enumerate(steps))
        return violations(t)

    clean = run(
        [C("step", "a"), C("update", "", False, 8, 8, rule)],
        [C("unscale_", "a"), C("step", "a"), C("update", "", False, 8, 16, rule)],
        [C("step", "a"), C("update", "", True, 16, 8, rule)],
    )
    assert clean == []
    assert run([C("unscale_", "a"), C("unscale_", "a"), C("step", "a"), C("update", "", False, 8, 8, rule)]) == [
        "step 0: unscale_(a) called 2 times (at most once per optimizer per step)"
    ]
    assert (
        "unscale_(a) after scaler.step(a)"
        in run([C("step", "a"), C("unscale_", "a"), C("update", "", False, 8, 8, rule)])[0]
    )
    assert (
        "scaler.step(b) after update()" in run([C("step", "a"), C("update", "", False, 8, 8, rule), C("step", "b")])[0]
    )
    # each optimizer's loss scaled after the previous update (Lightning's manual optimization): its
    # step is at the scale its gradients carry; only the second update breaks the contract
    interleaved = [
        C("scale"),
        C("step", "a"),
        C("update", "", False, 8, 8, rule, caller="trainer.Plugin.optimizer_step"),
        C("scale"),
        C("step", "b"),
        C("update", "", False, 8, 8, rule, caller="trainer.Plugin.optimizer_step"),
    ]
    assert [v.split(";")[0] for v in run(interleaved)] == [
        "step 0: update() called 2 times in an iteration whose scaler stepped a, b (once per iteration, after every "
        "optimizer's step)"
    ]
    assert "update() called from trainer.Plugin.optimizer_step" in run(interleaved)[0]
    assert "update() called 0 times" in run([C("step", "a")])[0]
    assert "the reference state machine" in run([C("step", "a"), C("update", "", True, 8, 8, rule)])[0]


def test_a_model_built_in_bf16_has_no_fp32_reference_and_the_verdict_says_so(training_checks):
    """The fp32 run trains bf16 parameters too: not "the AMP run equals the fp32 run" (INCONCLUSIVE),
    but a FAIL that there is no fp32 reference, naming the bf16 parameters."""

    def built_in_bf16(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1)).to(torch.bfloat16)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), 1e-2)}

    def step(o, batch, precision):
        x, y = batch
        with precision.autocast():
            loss = nn.functional.mse_loss(o["model"](x.to(torch.bfloat16)).float(), y)
        o["opt"].zero_grad()
        loss.backward()
        o["opt"].step()
        return loss

    def batches(seed):
        g = torch.Generator().manual_seed(seed)
        return [(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)) for _ in range(6)]

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(built_in_bf16, step, [BF16], batches=batches, name="bf16_built")
    [failure] = failed.value.result.failures
    assert (failure.kind, failure.name) == (
        VerdictKind.MASTER_WEIGHTS,
        "bf16_built.bf16.fp32_reference_params_not_fp32",
    )
    assert "no fp32 reference: 4 of 4 trained parameters are bfloat16 in the run handed fp32" in str(failed.value)
    assert "model.0.weight bfloat16" in str(failed.value)


def test_a_loss_computed_in_bf16_fails_naming_the_loss_and_a_float_loss_passes(training_checks):
    """A classifier whose cross-entropy is taken of its bf16 logits outside autocast (value and
    gradient rounded to 8 bits): the loss precision rule names it, whatever parity says of the run
    (here it drifts out of the band too; on the HF Trainer over 8 steps it does not)."""

    def classifier(seed):
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), 0.05)}

    def step(o, batch, precision, *, low_loss):
        x, y = batch
        with precision.autocast():
            logits = o["model"](x)
        loss = nn.functional.cross_entropy(logits if low_loss else logits.float(), y)
        o["opt"].zero_grad()
        loss.backward()
        o["opt"].step()
        return loss

    def batches(seed):
        g = torch.Generator().manual_seed(seed)
        return [(torch.randn(32, 16, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(8)]

    clean = training_checks.check_step(
        classifier, functools.partial(step, low_loss=False), [BF16], batches=batches, name="clf", overflow=False
    )
    assert [v.outcome for v in clean.of(VerdictKind.LOSS_PRECISION)] == [Outcome.PASS]
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(
            classifier, functools.partial(step, low_loss=True), [BF16], batches=batches, name="clf"
        )
    failures = [(v.kind, v.name) for v in failed.value.result.failures]
    assert (VerdictKind.LOSS_PRECISION, "clf.bf16.losses_in_low_precision") in failures, failures
    assert "loss 'loss' returned in bfloat16" in str(failed.value)


def test_code_that_raises_under_one_recipe_is_that_recipes_verdict_and_the_others_are_judged(training_checks):
    """A step that feeds bf16 inputs to an fp32 model only when handed bf16 (no autocast: a mixed
    dtype error): bf16's verdict names the recipe, the step and the exception; fp16 is still judged."""

    def step(o, batch, precision):
        x, y = batch
        if precision.dtype is torch.bfloat16:
            x = x.to(torch.bfloat16)  # the bug: a cast outside autocast
        loss = nn.functional.mse_loss(o["model"](x).float(), y)
        o["opt"].zero_grad()
        precision.scaler.scale(loss).backward()
        precision.scaler.step(o["opt"])
        precision.scaler.update()
        return loss

    def build(seed):
        torch.manual_seed(seed)
        model = nn.Linear(16, 1)
        return {"model": model, "opt": torch.optim.SGD(model.parameters(), 1e-2)}

    def batches(seed):
        g = torch.Generator().manual_seed(seed)
        return [(torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)) for _ in range(4)]

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(build, step, [BF16, FP16_SCALER], batches=batches, name="raiser", overflow=False)
    result = failed.value.result
    raised = result.of(VerdictKind.RAISED)
    assert [(v.recipe, v.outcome) for v in raised] == [("bf16", Outcome.FAIL)]
    assert "the code raised at step 0 under bf16: RuntimeError" in str(failed.value)
    assert {v.recipe for v in result.verdicts} == {"bf16", "fp16+scaler"}  # fp16 still judged


# -- distillation: a frozen teacher in bf16, a student in AMP -----------------------------------
def distillation(seed: int) -> dict[str, object]:
    torch.manual_seed(12345)  # one teacher for every seed: what differs between seeds is the student
    teacher = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 10)).to(torch.bfloat16).eval()
    teacher.requires_grad_(False)
    torch.manual_seed(seed)
    student = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 10))
    return {"teacher": teacher, "student": student, "opt": torch.optim.AdamW(student.parameters(), 3e-3)}


def distill_batches(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(2000 + seed)
    return [torch.randn(BATCH, 16, generator=gen) for _ in range(STEPS)]


def distill_step(o, x, precision, *, ignore_overflow=False):
    with torch.no_grad():
        soft = o["teacher"](x.to(torch.bfloat16)).float().softmax(-1)
    with precision.autocast():
        logits = o["student"](x)
    loss = nn.functional.kl_div(logits.float().log_softmax(-1), soft, reduction="batchmean")
    o["opt"].zero_grad()
    precision.scaler.scale(loss).backward()
    if ignore_overflow:
        precision.scaler.unscale_(o["opt"])
        o["opt"].step()
    else:
        precision.scaler.step(o["opt"])
    precision.scaler.update()
    return loss


def test_a_distillation_step_with_a_frozen_bf16_teacher_passes_clean(training_checks):
    result = training_checks.check_step(
        distillation, distill_step, [BF16, FP16_SCALER], batches=distill_batches, name="distill", resume_at=5
    )
    assert result.outcome is Outcome.PASS
    # the frozen teacher is a model without an optimizer: only the student's optimizer is planted
    assert [v.name for v in result.of(VerdictKind.OVERFLOW)] == ["distill.fp16+scaler.overflow.opt"]


def test_a_distillation_step_that_steps_through_an_overflow_fails_naming_its_optimizer(training_checks):
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(
            distillation,
            functools.partial(distill_step, ignore_overflow=True),
            [FP16_SCALER],
            batches=distill_batches,
            name="distill",
        )
    assert [v.name for v in failed.value.result.failures] == ["distill.fp16+scaler.overflow.opt"]


# -- each rule fails its planted bug ------------------------------------------------------------
def regression(seed: int) -> dict[str, object]:
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), 0.05)}


def regression_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3000 + seed)
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(99))
    out = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 16, generator=gen)
        out.append((x, x @ w))
    return out


def regression_step(o, batch, precision):
    x, y = batch
    with precision.autocast():
        loss = nn.functional.mse_loss(o["model"](x).float(), y)
    o["opt"].zero_grad()
    precision.scaler.scale(loss).backward()
    precision.scaler.step(o["opt"])
    precision.scaler.update()
    return loss


ACCUMULATE = 4  # micro-batches per optimizer step


def accumulating_step(o, batch, precision, *, bypass_scaler=False):
    """Gradient accumulation as PyTorch's AMP examples write it: each micro-batch's loss divided by
    the group size, scaled and backpropagated; the last of a group steps through the scaler."""
    x, y = batch
    k = o.setdefault("micro", [0])
    with precision.autocast():
        loss = nn.functional.mse_loss(o["model"](x).float(), y)
    precision.scaler.scale(loss / ACCUMULATE).backward()
    k[0] += 1
    if k[0] % ACCUMULATE == 0:
        if bypass_scaler:  # the bug: the group's step taken on the scaled gradients, the scaler left out
            o["opt"].step()
        else:
            precision.scaler.step(o["opt"])
            precision.scaler.update()
        o["opt"].zero_grad()
    return loss


def test_an_accumulating_step_is_judged_on_the_steps_it_takes_and_a_bypassed_scaler_fails(training_checks):
    """The optimizer steps once in four micro-batches, in fp32 as in AMP: parity is judged (before,
    one step in four read as a scaler that skipped 75% of its steps, INCONCLUSIVE). The same
    accumulation with the group's step bypassing the scaler fails parity."""
    clean = training_checks.check_step(regression, accumulating_step, [BF16, FP16_SCALER], batches=regression_batches)
    assert all(v.outcome is Outcome.PASS for v in clean.of(VerdictKind.PARITY)), [
        v.comparison for v in clean.of(VerdictKind.PARITY)
    ]
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(
            regression, functools.partial(accumulating_step, bypass_scaler=True), [FP16_SCALER],
            batches=regression_batches, overflow=False,
        )  # fmt: skip
    assert VerdictKind.PARITY in {v.kind for v in failed.value.result.failures}, str(failed.value)


def test_a_clean_regression_step_passes(training_checks):
    assert training_checks.check_step(regression, regression_step, [BF16, FP16_SCALER], batches=regression_batches)


def test_a_step_that_steps_the_optimizer_on_scaled_gradients_fails_parity(training_checks):
    def bypassed(o, batch, precision):
        x, y = batch
        with precision.autocast():
            loss = nn.functional.mse_loss(o["model"](x).float(), y)
        o["opt"].zero_grad()
        precision.scaler.scale(loss).backward()
        o["opt"].step()  # the bug: SGD on gradients still multiplied by the loss scale
        return loss

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(regression, bypassed, [FP16_SCALER], batches=regression_batches, overflow=False)
    assert VerdictKind.PARITY in {v.kind for v in failed.value.result.failures}


def test_a_step_that_trains_the_model_in_bf16_fails_the_master_weights_rule(training_checks):
    def pure_bf16(o, batch, precision):
        if not precision.is_fp32 and o["model"][0].weight.dtype != precision.dtype:
            o["model"].to(precision.dtype)  # the bug: no fp32 master weights
        x, y = batch
        with precision.autocast():
            loss = nn.functional.mse_loss(o["model"](x.to(o["model"][0].weight.dtype)).float(), y)
        o["opt"].zero_grad()
        loss.backward()
        o["opt"].step()
        return loss

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(regression, pure_bf16, [BF16], batches=regression_batches)
    kinds = {v.kind for v in failed.value.result.failures}
    assert VerdictKind.MASTER_WEIGHTS in kinds
    assert "model.0.weight torch.float32 -> torch.bfloat16" in str(failed.value)


def test_a_step_that_ignores_its_precision_is_inconclusive_not_a_pass(training_checks):
    def ignoring(o, batch, precision):
        x, y = batch
        loss = nn.functional.mse_loss(o["model"](x), y)  # no autocast, no scaler
        o["opt"].zero_grad()
        loss.backward()
        o["opt"].step()
        return loss

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(regression, ignoring, [BF16], batches=regression_batches)
    result = failed.value.result
    assert result.outcome is Outcome.INCONCLUSIVE
    assert [v.kind for v in result.failures] == [VerdictKind.PRECISION]
    assert "no module ran under autocast" in str(failed.value)


def test_a_nondeterministic_step_fails_determinism(training_checks):
    calls = itertools.count()

    def drifting(o, batch, precision):
        x, y = batch
        if not precision.is_fp32:
            x = x * (1 + 1e-3 * (next(calls) % 7))  # the bug: state outside the objects and the seed
        return regression_step(o, (x, y), precision)

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(regression, drifting, [BF16], batches=regression_batches)
    assert VerdictKind.DETERMINISM in {v.kind for v in failed.value.result.failures}


def test_a_resume_that_loses_state_outside_the_state_dicts_fails(training_checks):
    def warmup(seed):
        return {**regression(seed), "warmup": {"done": 0}}

    def warm_step(o, batch, precision):
        o["warmup"]["done"] += 1  # the bug: a schedule kept where no state_dict saves it
        for g in o["opt"].param_groups:
            g["lr"] = 0.05 * min(1.0, o["warmup"]["done"] / 10)
        return regression_step(o, batch, precision)

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_step(warmup, warm_step, [BF16], batches=regression_batches, resume_at=4)
    assert [v.kind for v in failed.value.result.failures] == [VerdictKind.RESUME]
    assert "resumed before step 4 parts from the uninterrupted run" in str(failed.value)


# -- bad input ----------------------------------------------------------------------------------
def test_a_step_that_returns_no_loss_is_an_error_saying_what_to_return(training_checks):
    with pytest.raises(TypeError, match="a step must return its loss"):
        training_checks.check_step(regression, lambda o, b, p: None, [BF16], batches=regression_batches)


def test_objects_the_harness_cannot_see_into_are_an_error_saying_how_to_return_them(training_checks):
    class Hidden:
        __slots__ = ("parts",)  # no __dict__: nothing for the walk to find

        def __init__(self, parts):
            self.parts = parts

    with pytest.raises(ValueError, match="no model or optimizer among the objects"):
        training_checks.check_step(
            lambda seed: Hidden(regression(seed)),
            lambda o, b, p: regression_step(o.parts, b, p),
            [BF16],
            batches=regression_batches,
        )


@pytest.mark.parametrize(
    ("recipes", "message"),
    [
        ([FP32], "fp32 is the reference"),
        ([CLIP], "your step does its own"),
        (BF16, "non-empty list"),
        ([], "non-empty"),
    ],
    ids=["fp32", "clip", "not-a-list", "empty"],
)
def test_recipes_a_step_cannot_be_handed_are_refused(training_checks, recipes, message):
    with pytest.raises((TypeError, ValueError), match=message):
        training_checks.check_step(regression, regression_step, recipes, batches=regression_batches)


def test_a_resume_point_past_the_run_and_one_seed_are_refused(training_checks):
    with pytest.raises(ValueError, match="before the last"):
        training_checks.check_step(regression, regression_step, [BF16], batches=regression_batches, resume_at=99)
    with pytest.raises(ValueError, match="at least 2"):
        training_checks.check_step(regression, regression_step, [BF16], batches=regression_batches, seeds=1)


# -- the module lane: a declared-fp32 region running in bf16 -------------------------------------
def custom_fwd_ignoring_cast(fwd=None, *, device_type, cast_inputs=None):
    """``torch.amp.custom_fwd`` as a regression would leave it: the declaration kept, its effect
    (inputs cast to ``cast_inputs``, autocast off inside) dropped."""
    if fwd is None:
        return functools.partial(custom_fwd_ignoring_cast, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def decorate_fwd(*args, **kwargs):
        assert cast_inputs is not None
        args[0]._dtype = torch.get_autocast_dtype(device_type)
        args[0]._fwd_used_autocast = torch.is_autocast_enabled(device_type)
        return fwd(*args, **kwargs)

    return decorate_fwd


def fp32_matmul(decorator):
    class Fp32Matmul(torch.autograd.Function):
        @staticmethod
        @decorator(device_type="cpu", cast_inputs=torch.float32)
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b

        @staticmethod
        @torch.amp.custom_bwd(device_type="cpu")
        def backward(ctx, grad):
            a, b = ctx.saved_tensors  # in fp32 whatever the forward received (a faulty cast among it)
            g = grad.float()
            return (g @ b.float().T).to(a.dtype), (a.float().T @ g).to(b.dtype)

    return Fp32Matmul


class Head(nn.Module):
    """A projection its author declared fp32 (a custom function with ``cast_inputs=torch.float32``)."""

    def __init__(self, function: type) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(64, 64) / 8)
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(x, self.weight)  # type: ignore[no-any-return]


def headed(decorator):
    def model(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), Head(fp32_matmul(decorator)), nn.Linear(64, 4)
        )

    return model


def headed_batch(step, gen):
    x = torch.randn(32, 32, generator=gen)
    return x, (x[:, :4] * 2).argmax(-1)


@pytest.mark.parametrize(("decorator", "passes"), [(torch.amp.custom_fwd, True), (custom_fwd_ignoring_cast, False)])
def test_the_module_lane_names_a_declared_fp32_function_that_ran_in_bf16(decorator, passes):
    setup = Setup("headed", headed(decorator), headed_batch, nn.functional.cross_entropy, 10, 1e-3)
    errors = ML.of_setup(setup, torch.bfloat16, torch.device("cpu"))
    verdict = ML.judge("headed", "bf16", errors)
    declared = [e for e in errors if e.declared != "autocast"]
    assert [e.name for e in declared] == ["3:Fp32Matmul"]
    assert verdict.passed is passes
    if not passes:
        assert "3:Fp32Matmul (Fp32Matmul, cast_inputs=torch.float32" in explain(verdict)
        assert declared[0].ratio > 1000  # bf16's error against fp32's: about 2^16 apart


def test_amp_training_check_fails_a_model_whose_fp32_function_ran_in_bf16(training_checks):
    setup = Setup("headed", headed(custom_fwd_ignoring_cast), headed_batch, nn.functional.cross_entropy, 10, 1e-3)
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check(setup, [BF16], seeds=2, determinism=False, lane=False, overflow=False, census=False)
    assert [v.kind for v in failed.value.result.failures] == [VerdictKind.MODULE_LANE]
    assert "3:Fp32Matmul" in str(failed.value)


def test_a_module_named_fp32_that_runs_under_autocast_fails_and_an_unknown_name_is_refused():
    setup = Setup("headed", headed(torch.amp.custom_fwd), headed_batch, nn.functional.cross_entropy, 10, 1e-3)
    errors = ML.of_setup(setup, torch.bfloat16, torch.device("cpu"), fp32_modules=("4",))
    assert not ML.judge("headed", "bf16", errors).passed
    assert [e.name for e in errors if not e.passed] == ["4"]
    with pytest.raises(ValueError, match="fp32_modules names no module"):
        ML.of_setup(setup, torch.bfloat16, torch.device("cpu"), fp32_modules=("head",))


def test_a_module_run_with_autocast_disabled_is_left_out_unless_named():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body, self.head = nn.Linear(32, 64), nn.Linear(64, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.body(x)
            with torch.autocast("cpu", enabled=False):
                return self.head(h.float())

    torch.manual_seed(0)
    model = Block()
    x = torch.randn(16, 32)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).square().mean().backward()

    errors = {e.name: e for e in ML.observe({"m": model}, step, "cpu", torch.bfloat16)}
    assert list(errors) == ["body"] and errors["body"].declared == "autocast"
    named = {e.name: e for e in ML.observe({"m": model}, step, "cpu", torch.bfloat16, fp32_modules=("head",))}
    assert named["head"].declared == "named fp32" and named["head"].passed


class _Bf16Accumulation(torch.overrides.TorchFunctionMode):
    """A broken autocast linear: products accumulated in bf16, 4 terms at a time."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not nn.functional.linear or not torch.is_autocast_enabled("cpu"):
            return func(*args, **kwargs)
        x, w = args[0].bfloat16(), args[1].bfloat16()
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        acc = torch.zeros(*x.shape[:-1], w.shape[0], dtype=torch.bfloat16)
        with torch.autocast("cpu", enabled=False):
            for k in range(0, x.shape[-1], 4):
                acc = (acc.float() + x[..., k : k + 4].float() @ w[:, k : k + 4].float().T).bfloat16()
        return acc if bias is None else acc + bias.bfloat16()


def test_the_module_lane_fails_a_linear_that_accumulates_in_bf16():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8))
    x = torch.randn(64, 256)

    def step(broken: bool) -> None:
        with _Bf16Accumulation() if broken else contextlib.nullcontext(), torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        y.float().square().mean().backward()

    clean = ML.observe({"m": model}, lambda: step(False), "cpu", torch.bfloat16)
    broken = ML.observe({"m": model}, lambda: step(True), "cpu", torch.bfloat16)
    assert ML.judge("m", "bf16", clean).passed
    assert sorted(e.name for e in broken if not e.passed) == ["0", "2"]  # both linears, not the GELU


def test_a_step_that_raises_leaves_no_hook_or_patch_behind(training_checks):
    scaler_methods = (torch.amp.GradScaler.unscale_, torch.amp.GradScaler.step, torch.amp.GradScaler.update)
    apply = torch.autograd.Function.apply

    def failing(o, batch, precision):
        if not precision.is_fp32:
            raise RuntimeError("the user's step broke")
        return regression_step(o, batch, precision)

    with pytest.raises(TrainingCheckFailed, match="the code raised at step 0 under fp16\\+scaler: RuntimeError"):
        training_checks.check_step(regression, failing, [FP16_SCALER], batches=regression_batches)
    assert (torch.amp.GradScaler.unscale_, torch.amp.GradScaler.step, torch.amp.GradScaler.update) == scaler_methods
    assert torch.autograd.Function.apply == apply

    def always(o, batch, precision):
        raise RuntimeError("the user's step broke")

    with pytest.raises(RuntimeError, match="the user's step broke"):  # raising in fp32 too: its own error
        training_checks.check_step(regression, always, [FP16_SCALER], batches=regression_batches)


def test_the_module_lane_fails_when_torch_itself_drops_a_cast_inputs_declaration(monkeypatch):
    import torch.amp.autocast_mode as autocast_mode

    # the fault in torch: custom_fwd neither casts the inputs nor turns autocast off inside
    monkeypatch.setattr(autocast_mode, "_cast", lambda value, device_type, dtype: value)
    monkeypatch.setattr(autocast_mode, "autocast", lambda **kw: contextlib.nullcontext())
    setup = Setup("headed", headed(torch.amp.custom_fwd), headed_batch, nn.functional.cross_entropy, 10, 1e-3)
    errors = ML.of_setup(setup, torch.bfloat16, torch.device("cpu"))
    assert [e.name for e in errors if not e.passed] == ["3:Fp32Matmul"]
