"""The compiled suite's shared graph: one small transformer-like block whose every stage is an op
autocast has a rule for, observed eager, compiled and in float64.

Compiling is the expensive part of this suite (a first Inductor compile of a tiny function takes
16-24 s on two cores), so the policy, numerics and speed checks all observe this one block: its
forward returns every stage's output, so each stage's dtype and value can be compared, and its
backward yields every parameter's gradient. ``tap`` hooks a function into every stage boundary:
the float64 reference uses it to propagate one low-precision rounding at a time (the numerics
budget, :mod:`harness.domains.compiled.budget`); compiled runs never pass it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.domains.engines.ops.probe import dtype_name

#: The block's stages in order: the outputs of :class:`Block` and the boundaries a ``tap`` sees.
STAGE_NAMES: tuple[str, ...] = (
    "linear",
    "layer_norm",
    "qkv",
    "attention",
    "projection",
    "gelu",
    "logits",
    "softmax",
    "loss",
)

Tap = Callable[[str, torch.Tensor], torch.Tensor]


def _identity(name: str, value: torch.Tensor) -> torch.Tensor:
    return value


class Block(nn.Module):
    """linear -> layer_norm -> qkv -> causal attention -> projection -> gelu -> logits -> softmax,
    and the cross-entropy loss of the logits (the composition the issue names, with attention)."""

    def __init__(self, width: int = 64, heads: int = 4, classes: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.inp = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor, tap: Tap | None = None) -> dict[str, torch.Tensor]:
        t = tap or _identity
        out: dict[str, torch.Tensor] = {}
        out["linear"] = h = t("linear", self.inp(x))
        out["layer_norm"] = n = t("layer_norm", self.norm(h))
        out["qkv"] = qkv = t("qkv", self.qkv(n))
        b, s, d = n.shape
        q, k, v = qkv.view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        out["attention"] = att = t("attention", att)
        out["projection"] = o = t("projection", self.proj(att))
        out["gelu"] = g = t("gelu", F.gelu(o) + o)
        out["logits"] = logits = t("logits", self.head(g))
        out["softmax"] = t("softmax", torch.softmax(logits, dim=-1))
        out["loss"] = t("loss", F.cross_entropy(logits.flatten(0, 1), y.flatten()))
        return out


#: Batch, sequence and width of the probe's inputs (the reduction lengths of its budget: width 64
#: in the linear layers and layer_norm, sequence 32 in attention, 32 classes in softmax).
BATCH, SEQUENCE, WIDTH, CLASSES = 4, 32, 64, 32
#: The longest reduction of any stage (the in-op accumulation term of the budget).
LONGEST_REDUCTION = 3 * WIDTH


def make_block(device: torch.device, seed: int = 0) -> Block:
    torch.manual_seed(seed)
    return Block(WIDTH, 4, CLASSES).to(device)


def make_inputs(device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(BATCH, SEQUENCE, WIDTH, generator=g)
    y = torch.randint(0, CLASSES, (BATCH, SEQUENCE), generator=g)
    return x.to(device).requires_grad_(), y.to(device)


@dataclass(frozen=True)
class Observation:
    """One run of the block: every stage's output and every gradient (parameters, and ``input``),
    detached; the dtype each had."""

    outputs: Mapping[str, torch.Tensor]
    grads: Mapping[str, torch.Tensor]

    def dtypes(self) -> dict[str, str]:
        return {k: dtype_name(v.dtype) for k, v in self.values().items()}

    def values(self) -> dict[str, torch.Tensor]:
        found = {f"forward.{k}": v for k, v in self.outputs.items()}
        found.update({f"grad.{k}": v for k, v in self.grads.items()})
        return found


Forward = Callable[..., dict[str, torch.Tensor]]


def observe(
    forward: Forward,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    dtype: torch.dtype | None,
    tap: Tap | None = None,
) -> Observation:
    """Forward under autocast (``dtype`` None: fp32, autocast off), backward outside it, as the
    autocast documentation recommends and as the training loop does."""
    model.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = forward(model, x, y) if tap is None else forward(model, x, y, tap)
    out["loss"].backward()  # type: ignore[no-untyped-call]
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}
    assert x.grad is not None
    grads["input"] = x.grad.detach().clone()
    return Observation({k: v.detach().clone() for k, v in out.items()}, grads)


def call_block(model: nn.Module, x: torch.Tensor, y: torch.Tensor, tap: Tap | None = None) -> Any:
    """The function the suite compiles: the module called with the batch (a plain function, so that
    every variant compiles the same code with a different autocast state)."""
    return model(x, y, tap)


def float64_copy(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).double()
