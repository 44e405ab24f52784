"""The built-in training problems: an MLP regression, a tiny causal transformer LM on a
Markov-chain token stream, and a small CNN with BatchNorm on synthetic images. Generated locally
and seeded; no downloads."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from harness.domains.engines.training.recipes import Batch, Setup


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))


_MLP_W = torch.randn(16, 4, generator=torch.Generator().manual_seed(123)) / 4


def _mlp_batch(step: int, gen: torch.Generator) -> Batch:
    x = torch.randn(64, 16, generator=gen)
    y = torch.tanh(x @ _MLP_W).sum(-1, keepdim=True) + 0.05 * torch.randn(64, 1, generator=gen)
    return x, y


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, -1)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(a)
        out: torch.Tensor = x + self.ff(self.ln2(x))
        return out


class TinyLM(nn.Module):
    """A 2-layer causal transformer: embeddings, LayerNorm, softmax attention, cross-entropy head."""

    def __init__(self, vocab: int = 64, width: int = 128, layers: int = 2, seq: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.02)
        self.blocks = nn.Sequential(*[_Block(width, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(self.blocks(self.emb(idx) + self.pos[: idx.shape[1]])))  # type: ignore[no-any-return]


def _lm(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return TinyLM()


#: A sparse Markov chain over 64 tokens (4 likely successors each): learnable, not trivial.
_TRANSITIONS = torch.zeros(64, 64)
_succ = torch.randint(0, 64, (64, 4), generator=torch.Generator().manual_seed(7))
_TRANSITIONS.scatter_(1, _succ, torch.tensor([0.55, 0.25, 0.15, 0.05]).expand(64, 4))


def _lm_batch(step: int, gen: torch.Generator, batch: int = 4, seq: int = 64) -> Batch:
    tokens = torch.empty(batch, seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, 64, (batch,), generator=gen)
    for t in range(seq):
        tokens[:, t + 1] = torch.multinomial(_TRANSITIONS[tokens[:, t]], 1, generator=gen).squeeze(1)
    return tokens[:, :-1], tokens[:, 1:]


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _cnn(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 4),
    )


def _cnn_batch(step: int, gen: torch.Generator) -> Batch:
    """16x16 images of noise with a bright 4x4 patch; the class is the patch's quadrant."""
    y = torch.randint(0, 4, (32,), generator=gen)
    x = 0.5 * torch.randn(32, 3, 16, 16, generator=gen)
    for i, c in enumerate(y.tolist()):
        r, q = divmod(c, 2)
        x[i, :, r * 8 + 2 : r * 8 + 6, q * 8 + 2 : q * 8 + 6] += 2.0
    return x, y


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, y)


SETUPS: dict[str, Setup] = {
    "mlp": Setup("mlp", _mlp, _mlp_batch, _mse, steps=60, lr=0.02, optimizer="sgd", checkpoint_every=10),
    # fine-tuning regime: Adam steps of ~1e-4 are below half an ulp of bf16 weights of magnitude > 0.05
    "mlp_small_lr": Setup(
        "mlp_small_lr", _mlp, _mlp_batch, _mse, steps=60, lr=1e-4, optimizer="adamw", checkpoint_every=10
    ),
    "tiny_lm": Setup("tiny_lm", _lm, _lm_batch, _lm_loss, steps=30, lr=3e-3),
    "cnn_bn": Setup("cnn_bn", _cnn, _cnn_batch, F.cross_entropy, steps=30, lr=3e-3),
}
