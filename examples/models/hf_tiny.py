"""Tiny Hugging Face models built from config objects (no download), as a user would hand them to
``amp_training.check``: GPT-2 and Llama causal LMs with their own loss, and BERT sequence
classification with dict batches (input_ids, attention_mask, labels). Hidden size 64, 2 layers,
4 heads, vocabulary 256, the library's default dropout; 20 steps of AdamW.

Needs ``transformers`` (the opt-in ``tox -e thirdparty`` installs it)::

    from examples.models.hf_tiny import SETUPS
    amp_training.check(SETUPS["gpt2"], [api.BF16, api.FP16_SCALER])
"""

from __future__ import annotations

from typing import Any

import torch

from harness.api import Setup

VOCAB, SEQ, BATCH, HIDDEN, LAYERS, HEADS = 256, 32, 8, 64, 2, 4
STEPS, LR, CHECKPOINT_EVERY = 20, 3e-3, 5

#: A sparse Markov chain over the vocabulary (4 likely successors each): learnable, not trivial.
_SUCCESSORS = torch.randint(0, VOCAB, (VOCAB, 4), generator=torch.Generator().manual_seed(7))
_WEIGHTS = torch.tensor([0.55, 0.25, 0.15, 0.05])


def _tokens(gen: torch.Generator) -> torch.Tensor:
    ids = torch.empty(BATCH, SEQ, dtype=torch.long)
    ids[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=gen)
    for t in range(1, SEQ):
        pick = torch.multinomial(_WEIGHTS.expand(BATCH, 4), 1, generator=gen).squeeze(1)
        ids[:, t] = _SUCCESSORS[ids[:, t - 1], pick]
    return ids


def lm_batch(step: int, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], None]:
    """Markov token rows; the last 8 positions of every other row are padding (masked, label -100)."""
    ids = _tokens(gen)
    mask = torch.ones_like(ids)
    mask[::2, -8:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}, None


def classification_batch(step: int, gen: torch.Generator) -> tuple[dict[str, torch.Tensor], None]:
    """Token rows labelled by whether their first token is in the lower half of the vocabulary."""
    ids = _tokens(gen)
    mask = torch.ones_like(ids)
    mask[::2, -8:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": (ids[:, 0] < VOCAB // 2).long()}, None


def _transformers() -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # import-time notices about the environment
        import transformers
    return transformers


def gpt2(seed: int) -> torch.nn.Module:
    tf = _transformers()
    torch.manual_seed(seed)
    config = tf.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS)
    return tf.GPT2LMHeadModel(config)  # type: ignore[no-any-return]


def llama(seed: int) -> torch.nn.Module:
    tf = _transformers()
    torch.manual_seed(seed)
    config = tf.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=4 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=SEQ,
    )
    return tf.LlamaForCausalLM(config)  # type: ignore[no-any-return]


def bert(seed: int) -> torch.nn.Module:
    tf = _transformers()
    torch.manual_seed(seed)
    config = tf.BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        max_position_embeddings=SEQ,
        num_labels=2,
    )
    return tf.BertForSequenceClassification(config)  # type: ignore[no-any-return]


SETUPS: dict[str, Setup] = {
    "gpt2": Setup("hf_gpt2", gpt2, lm_batch, None, STEPS, LR, checkpoint_every=CHECKPOINT_EVERY),
    "llama": Setup("hf_llama", llama, lm_batch, None, STEPS, LR, checkpoint_every=CHECKPOINT_EVERY),
    "bert": Setup("hf_bert", bert, classification_batch, None, STEPS, LR, checkpoint_every=CHECKPOINT_EVERY),
}


def main() -> None:
    """Print each tiny model's verdicts as ``amp_training.check`` gives them, with the lane's power:
    ``python -m examples.models.hf_tiny`` (a few minutes on 2 cores)."""
    from harness.api import BF16, FP16_SCALER, TrainingCheckFailed, VerdictKind
    from harness.domains.training.check import TrainingChecks
    from harness.pytest_plugin.recording import Recorder, TestIdentity

    for key, setup in SETUPS.items():
        for recipe in (BF16, FP16_SCALER):
            recorder = Recorder(
                TestIdentity(key, "training", key), "run", lambda row: None, lambda d: "p", lambda o, n: None
            )
            checks = TrainingChecks(recorder, torch.device("cpu"))
            try:
                result = checks.check(setup, [recipe], determinism=False, ladder=True)
            except TrainingCheckFailed as failed:
                result = failed.result  # the same typed result: no message text is read
            [parity] = result.of(VerdictKind.PARITY)
            [lane] = result.of(VerdictKind.LANE)
            controls = {
                v.name.split(".")[2]: f"{v.comparison.measurement().value:.3g}x" for v in result.of(VerdictKind.POWER)
            }
            limit = result.detection_limits.get(recipe.name)
            print(
                f"{setup.name:10s} {recipe.name:12s} {result.outcome.label:12s} parity "
                f"{parity.comparison.measurement().value:.3g} of its allowance, lane "
                f"{lane.comparison.measurement().value:.3g}x (allowed 2), controls {controls}, smallest gradient "
                f"noise caught {limit if limit is None else f'{limit:.3g}'}",
                flush=True,
            )


if __name__ == "__main__":
    main()
