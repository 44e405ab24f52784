"""Opt-in (``tox -e thirdparty``): a Hugging Face causal LM through ``amp_training`` as it is: built
from a config (no download), batches of keyword inputs with an attention mask and labels, its own
output type (``CausalLMOutputWithCrossAttentions``) and its own loss. Skipped where transformers is
not installed."""

from __future__ import annotations

import warnings

import pytest
import torch

from harness.api import Outcome, TrainingCheckFailed, VerdictKind
from harness.domains.engines import training as T
from harness.domains.training import recompute

with warnings.catch_warnings():
    # transformers' import-time notices are about its environment, not about the check
    warnings.simplefilter("ignore")
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed: the opt-in environment `tox -e thirdparty` installs it"
    )

VOCAB, SEQ = 64, 32


def gpt2(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return transformers.GPT2LMHeadModel(config)


def lm_batch(step: int, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], None]:
    """The tiny LM's Markov token stream; the last 8 positions of every other row are padding."""
    ids, _ = T.SETUPS["tiny_lm"].batch(step, gen)
    ids = ids[:8, :SEQ] % VOCAB
    mask = torch.ones_like(ids)
    mask[::2, -8:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}, None


def logits_batch(step: int, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    inputs, _ = lm_batch(step, gen)
    return {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}, inputs["labels"]


def shifted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))


def test_a_hugging_face_causal_lm_with_its_own_loss_goes_through_unwrapped(amp_training, amp_device):
    setup = T.Setup("gpt2_own_loss", gpt2, lm_batch, loss=None, steps=12, lr=3e-3, checkpoint_every=4)
    amp_training.check(setup, [T.BF16, T.FP16_SCALER], census=False)


def test_a_hugging_face_causal_lm_judged_on_its_logits_with_a_loss_of_yours(amp_training, amp_device):
    setup = T.Setup("gpt2_logits", gpt2, logits_batch, shifted_cross_entropy, steps=12, lr=3e-3, checkpoint_every=4)
    amp_training.check(setup, [T.BF16], determinism=False, census=False)


# -- tiny GPT-2, Llama and BERT configs: the verdicts a user gets ----------------------------------
@pytest.mark.parametrize("model", ["gpt2", "llama", "bert"])
def test_broken_recipes_are_never_pass_and_clean_ones_never_fail_on_tiny_hugging_face_models(training_checks, model):
    """The canonical broken recipes (no fp32 master weights; fp16 without loss scaling), given as a
    user's own recipes, FAIL or are INCONCLUSIVE with the reason; clean bf16 and fp16 + GradScaler
    PASS or are INCONCLUSIVE with the reason (20 steps, as examples.models.hf_tiny builds them).
    All four in one check, the broken ones first: each recipe is judged from its own run's states
    (a lane reference of the same dtype was once reused across recipes, failing the clean bf16)."""
    from dataclasses import replace

    from examples.models.hf_tiny import SETUPS
    from harness.domains.engines.training import amp_lane as L

    setup = SETUPS[model]
    broken = [
        replace(L.master_weights_control(T.BF16), control=False),
        replace(L.no_scaling_control(T.FP16_SCALER), control=False),
    ]
    clean = [T.BF16, T.FP16_SCALER]
    # overflow handling is the optimizer's and the scaler's, the same on every model, and none of
    # these models checkpoints activations: GPT-2 shows both; the others do not run them again
    again = {"overflow": False, "recompute": False} if model != "gpt2" else {}
    try:  # one check of the four recipes: their fp32 references and seed spread are computed once
        result = training_checks.check(setup, [*broken, *clean], determinism=False, **again)
    except TrainingCheckFailed as failed:
        result = failed.result
    outcomes = {r.name: {v.outcome for v in result.verdicts if v.recipe == r.name} for r in (*broken, *clean)}
    for recipe in broken:
        assert outcomes[recipe.name] & {Outcome.FAIL, Outcome.INCONCLUSIVE}, (recipe.name, result.explain())
    for recipe in clean:
        bad = [v.comparison.explain() for v in result.verdicts if v.recipe == recipe.name and v.outcome is Outcome.FAIL]
        assert outcomes[recipe.name] and not bad, (recipe.name, bad)


# -- activation checkpointing as Hugging Face enables it ----------------------------------------------
def _checkpointed_gpt2(reentrant: bool, fp32_recompute: bool = False):
    """GPT-2 with ``gradient_checkpointing_enable()``; ``fp32_recompute``: each block's checkpoint
    function recomputes with autocast disabled (the fault a recompute in another precision is)."""

    def model(seed: int) -> torch.nn.Module:
        m = gpt2(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the method's rename notices
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        if fp32_recompute:
            for block in m.transformer.h:
                original = block._gradient_checkpointing_func

                def recompute_in_fp32(fn, *args, original=original, **kwargs):
                    calls = [0]

                    def run(*a, **k):
                        calls[0] += 1
                        if calls[0] == 1:
                            return fn(*a, **k)
                        with torch.autocast(a[0].device.type, enabled=False):
                            return fn(
                                *(t.float() if torch.is_tensor(t) and t.is_floating_point() else t for t in a), **k
                            )

                    return original(run, *args, **kwargs)

                block._gradient_checkpointing_func = recompute_in_fp32
        return m

    return model


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_gradient_checkpointing_as_hugging_face_enables_it_passes_with_its_resume_row(amp_training, reentrant):
    setup = T.Setup("gpt2_checkpointed", _checkpointed_gpt2(reentrant), lm_batch, loss=None, steps=12, lr=3e-3,
                    checkpoint_every=4)  # fmt: skip
    result = amp_training.check(setup, [T.BF16], seeds=2, resume_at=6)
    assert [v.outcome.value for v in result.of(VerdictKind.RECOMPUTE)] == ["pass"]
    assert [v.outcome.value for v in result.of(VerdictKind.RESUME)] == ["pass"]


def test_activation_checkpointing_of_every_other_layer_passes_and_recomputes_only_those(amp_training):
    """transformers 5's newer entry point, checkpointing every other layer (of GPT-2's two, the first)."""
    if not hasattr(transformers.PreTrainedModel, "activation_checkpointing_enable"):
        pytest.skip("this transformers has no activation_checkpointing_enable (added in 5.x)")

    def model(seed: int) -> torch.nn.Module:
        m = gpt2(seed)
        m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=2)
        return m

    setup = T.Setup("gpt2_every_other_layer", model, lm_batch, loss=None, steps=12, lr=3e-3, checkpoint_every=4)
    result = amp_training.check(setup, [T.BF16], seeds=2, resume_at=6)
    assert [v.outcome.value for v in result.of(VerdictKind.RECOMPUTE)] == ["pass"]
    assert [v.outcome.value for v in result.of(VerdictKind.RESUME)] == ["pass"]
    blocks = {n.split(".")[2] for n in recompute.observe(setup, T.BF16, torch.device("cpu")).recomputed}
    assert blocks == {"0"}, blocks  # the layers' index in transformer.h.<i>


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_a_hugging_face_block_recomputed_in_fp32_fails_naming_it(training_checks, reentrant):
    setup = T.Setup("gpt2_fp32_recompute", _checkpointed_gpt2(reentrant, fp32_recompute=True), lm_batch, loss=None,
                    steps=12, lr=3e-3, checkpoint_every=4)  # fmt: skip
    with pytest.raises(AssertionError, match=r"recomputed in another precision in transformer\.h\.1"):
        training_checks.check(setup, [T.BF16], seeds=2)
