"""The trainers people use, judged as they apply AMP (opt-in: ``tox -e thirdparty``, CI's
thirdparty step): tiny GPT-2 through the Hugging Face ``Trainer``, a tiny Llama through Accelerate,
a small Lightning module (automatic and manual optimization). Each passes in bf16; fp16 is
INCONCLUSIVE where the trainer does not apply it on a CPU (Accelerate, and so the HF Trainer, train
fp16 in fp32 there); each adapter's planted AMP bug fails. Each skips, naming its extra, where its
package is missing."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest
import torch
from torch import nn

from harness.api import (
    BF16,
    FP16_SCALER,
    AccelerateProgram,
    HFTrainerProgram,
    LightningProgram,
    TrainingCheckFailed,
    VerdictKind,
)
from harness.domains.training.trainers import available
from harness.numerics.verdict import Outcome

pytestmark = pytest.mark.amp_thorough

VOCAB, SEQ = 64, 16


def _needs(package: str, extra: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(
        not available(package), reason=f"{package} is not installed: pip install 'amp-harness[{extra}]'"
    )


def _transformers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its import-time notices are about the environment
        import transformers
    return transformers


def tokens(seed: int, rows: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (SEQ,), generator=gen) for _ in range(rows)]


# -- Hugging Face Trainer: tiny GPT-2 --------------------------------------------------------------
def gpt2(seed: int) -> nn.Module:
    tf = _transformers()
    config = tf.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return tf.GPT2LMHeadModel(config)


def gpt2_program() -> HFTrainerProgram:
    return HFTrainerProgram(
        "hf_gpt2",
        gpt2,
        lambda seed: [{"input_ids": t, "labels": t} for t in tokens(seed, 64)],
        steps=8,
        args={"learning_rate": 1e-3, "per_device_train_batch_size": 8},
    )


@_needs("transformers", "hf")
def test_the_hf_trainer_passes_in_bf16_and_its_cpu_fp16_is_inconclusive_as_ignored(training_checks):
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(gpt2_program(), [BF16, FP16_SCALER], seeds=3)
    result = failed.value.result
    assert all(v.passed for v in result.verdicts if v.recipe == "bf16")
    assert {v.kind for v in result.verdicts if v.recipe == "bf16"} >= {
        VerdictKind.PRECISION,
        VerdictKind.PARITY,
        VerdictKind.MASTER_WEIGHTS,
        VerdictKind.MODULE_LANE,
    }
    assert [(v.kind, v.outcome) for v in result.failures] == [(VerdictKind.PRECISION, Outcome.INCONCLUSIVE)]
    assert "no module ran under autocast" in str(failed.value)


@_needs("transformers", "hf")
def test_a_trainer_that_casts_the_model_to_bf16_fails_the_master_weights_rule(training_checks, monkeypatch):
    tf = _transformers()
    create = tf.Trainer.create_optimizer

    def cast_then_create(self, *args, **kwargs):
        if self.args.bf16:
            self.model.to(torch.bfloat16)  # the planted bug: no fp32 master weights
        return create(self, *args, **kwargs)

    monkeypatch.setattr(tf.Trainer, "create_optimizer", cast_then_create)
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(gpt2_program(), [BF16], seeds=3)
    assert VerdictKind.MASTER_WEIGHTS in {v.kind for v in failed.value.result.failures}


def bf16_cross_entropy(outputs, labels, num_items_in_batch=None):
    """The planted bug: the loss of bf16 logits, outside autocast (its log-softmax, value and
    gradient in bf16, where autocast keeps cross_entropy in fp32)."""
    logits = outputs.logits[:, :-1].to(torch.bfloat16)
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


@_needs("transformers", "hf")
def test_a_loss_computed_in_bf16_fails_through_compute_loss_func_and_a_trainer_subclass(training_checks):
    """The same bf16 loss, given to the Trainer as ``compute_loss_func`` and as a subclass's own
    ``compute_loss`` (the way most users customise the loss): parity passes it over 8 steps, the loss
    precision rule names it."""
    tf = _transformers()

    class MyTrainer(tf.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            outputs = model(input_ids=inputs["input_ids"])
            loss = bf16_cross_entropy(outputs, inputs["labels"])
            return (loss, outputs) if return_outputs else loss

    for program in (
        dataclasses.replace(gpt2_program(), trainer={"compute_loss_func": bf16_cross_entropy}),
        dataclasses.replace(gpt2_program(), trainer_class=MyTrainer),
    ):
        with pytest.raises(TrainingCheckFailed) as failed:
            training_checks.check_program(program, [BF16], seeds=3)
        assert [(v.kind, v.name) for v in failed.value.result.failures] == [
            (VerdictKind.LOSS_PRECISION, "hf_gpt2.bf16.losses_in_low_precision")
        ], str(failed.value)
        assert "loss 'loss' returned in bfloat16" in str(failed.value)
    # where the harness sees the loss's inputs (compute_loss_func's logits and labels) it says how
    # far the bf16 loss lies from the same loss on float64 logits
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(
            dataclasses.replace(gpt2_program(), trainer={"compute_loss_func": bf16_cross_entropy}), [BF16], seeds=3
        )
    error = re.search(r"the same loss from float64 inputs: ([0-9.e-]+), ([0-9.e-]+) u of bfloat16", str(failed.value))
    assert error is not None and float(error[2]) > 0.5, str(failed.value)  # the casts kept wide: a real size


def test_a_trainer_class_that_is_no_trainer_is_refused(training_checks):
    if not available("transformers"):
        pytest.skip("transformers is not installed: pip install 'amp-harness[hf]'")
    with pytest.raises(TypeError, match=r"a subclass of transformers\.Trainer"):
        training_checks.check_program(dataclasses.replace(gpt2_program(), trainer_class=dict), [BF16], seeds=2)


# -- Accelerate: tiny Llama ------------------------------------------------------------------------
def llama(seed: int) -> nn.Module:
    tf = _transformers()
    config = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    return tf.LlamaForCausalLM(config)


def llama_program() -> AccelerateProgram:
    def batches(seed: int) -> list[dict[str, torch.Tensor]]:
        rows = tokens(seed, 96)
        return [
            {"input_ids": torch.stack(rows[i : i + 8]), "labels": torch.stack(rows[i : i + 8])} for i in range(0, 96, 8)
        ]

    return AccelerateProgram(
        "accelerate_llama",
        llama,
        lambda params: torch.optim.AdamW(params, 1e-3),
        batches,
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / 4)),
        clip=1.0,
    )


@_needs("accelerate", "accelerate")
@_needs("transformers", "hf")
def test_accelerate_passes_in_bf16_and_its_cpu_fp16_is_inconclusive_as_ignored(training_checks):
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(llama_program(), [BF16, FP16_SCALER], seeds=3)
    result = failed.value.result
    assert all(v.passed for v in result.verdicts if v.recipe == "bf16")
    assert [(v.kind, v.recipe, v.outcome) for v in result.failures] == [
        (VerdictKind.PRECISION, "fp16+scaler", Outcome.INCONCLUSIVE)
    ]


@_needs("accelerate", "accelerate")
@_needs("transformers", "hf")
@_needs("accelerate", "accelerate")
@_needs("transformers", "hf")
def test_accelerate_with_gradient_accumulation_is_judged_on_the_steps_it_takes(training_checks):
    """``accelerator.accumulate`` over 2 micro-batches: the prepared optimizer steps once a group in
    fp32 and bf16 alike, and bf16 passes every verdict (parity judged, not INCONCLUSIVE)."""
    program = dataclasses.replace(llama_program(), accumulate=2)
    result = training_checks.check_program(program, [BF16], seeds=3)
    assert result.outcome is Outcome.PASS
    assert [v.outcome for v in result.of(VerdictKind.PARITY)] == [Outcome.PASS]


def test_an_accelerator_whose_autocast_is_lost_is_inconclusive_not_a_pass(training_checks, monkeypatch):
    import accelerate

    # the planted bug: the prepared model's forward runs without the accelerator's autocast
    monkeypatch.setattr(accelerate.Accelerator, "autocast", lambda self, *a, **k: torch.autocast("cpu", enabled=False))
    monkeypatch.setattr(
        accelerate.accelerator,
        "get_mixed_precision_context_manager",
        lambda *a, **k: torch.autocast("cpu", enabled=False),
    )
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(llama_program(), [BF16], seeds=3)
    assert [(v.kind, v.outcome) for v in failed.value.result.failures] == [
        (VerdictKind.PRECISION, Outcome.INCONCLUSIVE)
    ]


# -- Lightning: automatic and manual optimization ---------------------------------------------------
def _lightning():
    import lightning

    return lightning


def regression_batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(16, 1, generator=torch.Generator().manual_seed(99))
    out = []
    for _ in range(16):
        x = torch.randn(32, 16, generator=gen)
        out.append((x, x @ w))
    return out


def regressor(manual: bool):
    L = _lightning()

    class Regressor(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 1))
            self.automatic_optimization = not manual

        def training_step(self, batch, index):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x).float(), y)
            if manual:
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), 0.05)

    return lambda seed: Regressor()


@_needs("lightning", "lightning")
@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_lightning_passes_in_bf16_and_fp16_with_its_scaler(training_checks, manual):
    result = training_checks.check_program(
        LightningProgram("lightning", regressor(manual), regression_batches), [BF16, FP16_SCALER], seeds=3
    )
    assert result.outcome is Outcome.PASS
    assert [v.name for v in result.of(VerdictKind.OVERFLOW)] == ["lightning.fp16+scaler.overflow.optimizers.0"]


@_needs("lightning", "lightning")
def test_lightning_as_configured_on_a_cpu_swaps_fp16_for_bf16_and_says_so(training_checks):
    program = LightningProgram("lightning", regressor(False), regression_batches, as_configured=True)
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(program, [FP16_SCALER], seeds=3)
    assert "modules ran under autocast in torch.bfloat16, not torch.float16" in str(failed.value)


@_needs("lightning", "lightning")
def test_a_lightning_precision_plugin_that_steps_through_an_overflow_fails_naming_the_optimizer(
    training_checks, monkeypatch
):
    L = _lightning()
    plugin = L.pytorch.plugins.precision.MixedPrecision

    def stepping_anyway(self, optimizer, model, closure, **kwargs):
        closure()
        self.scaler.unscale_(optimizer)
        out = optimizer.step(**kwargs)  # the planted bug: the step is taken whatever unscale_ found
        self.scaler.update()
        return out

    monkeypatch.setattr(plugin, "optimizer_step", stepping_anyway)
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(
            LightningProgram("lightning", regressor(False), regression_batches), [FP16_SCALER], seeds=3
        )
    names = [v.name for v in failed.value.result.failures]
    assert "lightning.fp16+scaler.overflow.optimizers.0" in names


def gan_batches(seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(32, 8, generator=gen) + 2.0 for _ in range(12)]


def lightning_gan(bypass_d: bool = False):
    """A GAN in manual optimization with two optimizers, as Lightning's docs write one;
    ``bypass_d``: the planted bug, the discriminator stepped on the raw optimizer (its gradients
    still scaled under 16-mixed, and its overflow not skipped)."""
    L = _lightning()

    class Gan(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.generator = nn.Sequential(nn.Linear(4, 32), nn.GELU(), nn.Linear(32, 8))
            self.discriminator = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 1))

        def _judged(self, x: torch.Tensor, real: bool) -> torch.Tensor:
            logits = self.discriminator(x).float()
            return nn.functional.binary_cross_entropy_with_logits(logits, torch.full_like(logits, float(real)))

        def training_step(self, real, index):
            opt_g, opt_d = self.optimizers()
            z = torch.randn(real.shape[0], 4, generator=torch.Generator().manual_seed(index)).to(real)
            fake = self.generator(z)
            d_loss = self._judged(real, True) + self._judged(fake.detach(), False)
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            (opt_d.optimizer if bypass_d else opt_d).step()
            g_loss = self._judged(fake, True)
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            return {"loss": g_loss.detach(), "d_loss": d_loss.detach()}

        def configure_optimizers(self):
            return torch.optim.Adam(self.generator.parameters(), 1e-3), torch.optim.Adam(
                self.discriminator.parameters(), 1e-3
            )

    return lambda seed: Gan()


@_needs("lightning", "lightning")
def test_lightning_manual_optimization_with_two_optimizers_passes_in_bf16(training_checks):
    result = training_checks.check_program(LightningProgram("lightning_gan", lightning_gan(), gan_batches), [BF16])
    assert result.outcome is Outcome.PASS


@_needs("lightning", "lightning")
def test_lightnings_16_mixed_updates_the_scale_after_each_optimizer_and_the_verdict_names_it(training_checks):
    """Lightning's MixedPrecision plugin calls update() after every optimizer's step; with two
    optimizers in manual optimization that is twice per iteration (PyTorch's AMP examples: once,
    after every optimizer has stepped). The contract fails naming the plugin as the caller; parity
    and the overflow checks of both optimizers pass."""
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(LightningProgram("lightning_gan", lightning_gan(), gan_batches), [FP16_SCALER])
    failures = failed.value.result.failures
    assert [v.name for v in failures] == ["lightning_gan.fp16+scaler.scaler_contract"], str(failed.value)
    assert "update() called 2 times" in str(failed.value)
    assert "update() called from lightning.pytorch.plugins.precision.amp.MixedPrecision.optimizer_step" in str(
        failed.value
    )


@_needs("lightning", "lightning")
def test_a_lightning_gan_stepping_one_optimizer_around_the_plugin_fails_naming_it(training_checks):
    """The discriminator stepped on the raw optimizer: under 16-mixed it consumes scaled gradients
    and steps through overflows; the verdicts name that optimizer."""
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(
            LightningProgram("lightning_gan", lightning_gan(bypass_d=True), gan_batches), [FP16_SCALER]
        )
    names = [v.name for v in failed.value.result.failures]
    assert "lightning_gan.fp16+scaler.overflow.optimizers.1" in names, str(failed.value)


# -- the trainers' own checkpoints -------------------------------------------------------------------
@_needs("transformers", "hf")
def test_the_hf_trainer_resumes_bit_for_bit_from_its_own_checkpoint_and_a_lost_optimizer_state_fails(
    training_checks,
):
    """``resume_at`` drives the Trainer's ``save_steps`` and ``resume_from_checkpoint``: resumed, the
    run is the uninterrupted one bit for bit. A Trainer that does not load its optimizer's state
    (Adam's moments start again) parts from it and fails, naming the steps."""
    result = training_checks.check_program(gpt2_program(), [BF16], seeds=3, resume_at=4)
    assert [v.outcome for v in result.verdicts if "resume" in v.name] == [Outcome.PASS]
    tf = _transformers()

    class ForgetfulTrainer(tf.Trainer):
        def _load_optimizer_and_scheduler(self, checkpoint):  # the planted bug: nothing restored
            return None

    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(
            dataclasses.replace(gpt2_program(), trainer_class=ForgetfulTrainer), [BF16], seeds=3, resume_at=4
        )
    assert [v.name for v in failed.value.result.failures] == ["hf_gpt2.bf16.resume_differences"], str(failed.value)
    assert "through the trainer's own checkpoint" in str(failed.value)


@_needs("lightning", "lightning")
@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_lightning_resumes_bit_for_bit_from_its_checkpoint_and_a_scaler_left_unrestored_fails(
    training_checks, monkeypatch, manual
):
    """``resume_at`` saves a mid-epoch checkpoint and fits a fresh module from it (``ckpt_path``):
    the run, the fp16 scale included, is the uninterrupted one bit for bit. A precision plugin that
    does not load its GradScaler's state restarts the scale and fails fp16's resume."""
    program = LightningProgram("lightning", regressor(manual), regression_batches)
    result = training_checks.check_program(program, [BF16, FP16_SCALER], seeds=3, resume_at=5)
    assert [v.outcome for v in result.verdicts if "resume" in v.name] == [Outcome.PASS, Outcome.PASS]
    L = _lightning()
    monkeypatch.setattr(L.pytorch.plugins.precision.MixedPrecision, "load_state_dict", lambda self, state: None)
    with pytest.raises(TrainingCheckFailed) as failed:
        training_checks.check_program(program, [BF16, FP16_SCALER], seeds=3, resume_at=5)
    assert [v.name for v in failed.value.result.failures] == ["lightning.fp16+scaler.resume_differences"]
    assert "scales" in str(failed.value)
