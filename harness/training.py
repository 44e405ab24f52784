"""Small, deterministic mixed-precision training runs, and the public bring-your-own-model API.

A :class:`Recipe` says how a step runs (precision, loss scaling, accumulation, clipping, and the
deliberately wrong variants used as negative controls). :func:`train` runs one recipe on a model
factory and a batch function and returns the loss curve. Pure: no pytest, no files; torch only.

Models and data are generated locally and seeded: an MLP regression, a tiny causal transformer
language model on a Markov-chain token stream, and a small CNN with BatchNorm on synthetic images.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from harness.formats import FP16

Batch = tuple[torch.Tensor, torch.Tensor]
ModelFactory = Callable[[], nn.Module]
BatchFn = Callable[[int, torch.Generator], Batch]  # (step, generator) -> (inputs, targets)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Recipe:
    """How one training step runs. ``control`` names a deliberately wrong variant."""

    name: str
    dtype: torch.dtype | None = None  # autocast dtype; None = fp32
    scaler: bool = False
    micro_batches: int = 1
    clip: float | None = None
    params_dtype: torch.dtype | None = None  # control: parameters (and optimizer) in low precision
    grad_accum_dtype: torch.dtype | None = None  # control: micro-batch gradients summed in this dtype
    loss_factor: float = 1.0  # small-gradient regime: loss x factor, lr / factor (SGD: same training in exact math)
    static_scale: float | None = None  # static loss scaling (Micikevicius et al.): loss x S, gradients / S
    control: bool = False

    def fp32_counterpart(self) -> Recipe:
        """The fp32 run this recipe must match: same accumulation, clipping and loss factor."""
        return Recipe(
            f"fp32[{self.name}]", micro_batches=self.micro_batches, clip=self.clip, loss_factor=self.loss_factor
        )


FP32 = Recipe("fp32")
BF16 = Recipe("bf16", dtype=torch.bfloat16)
FP16_SCALER = Recipe("fp16+scaler", dtype=torch.float16, scaler=True)
ACCUM4 = Recipe("fp16+scaler+accum4", dtype=torch.float16, scaler=True, micro_batches=4)
CLIP = Recipe("fp16+scaler+clip", dtype=torch.float16, scaler=True, clip=0.5)
#: Negative controls (Micikevicius et al. 2018 and the source text's pitfalls): each must fail parity.
SMALL_GRAD = 2.0**-24  # gradients ~1e-3 x 2^-24 ~ 6e-11: below fp16's smallest subnormal 2^-24 ~ 6e-8
FP16_NO_SCALER = Recipe("fp16 without loss scaling", dtype=torch.float16, loss_factor=SMALL_GRAD, control=True)
FP16_WITH_SCALER_SMALL = Recipe(
    "fp16+scaler (small gradients)", dtype=torch.float16, scaler=True, loss_factor=SMALL_GRAD
)
BF16_PARAMS = Recipe("bf16 parameters, no fp32 master weights", params_dtype=torch.bfloat16, control=True)
#: Static scaling 2^16 with micro-batch gradients unscaled into fp32 buffers: passes (the twin below fails).
FP16_STATIC_FP32_ACCUM = Recipe(
    "fp16+static scale, fp32 accumulation (small gradients)",
    dtype=torch.float16,
    micro_batches=4,
    static_scale=2.0**16,
    loss_factor=SMALL_GRAD,
)
#: The same recipe with one fault: the micro-batch gradient buffers are fp16.
FP16_GRAD_ACCUM = replace(
    FP16_STATIC_FP32_ACCUM,
    name="gradients accumulated in fp16 (small gradients)",
    grad_accum_dtype=torch.float16,
    control=True,
)
#: The source text's advice for pitfall 2 ("accumulate in fp32 or use bf16"): bf16 buffers over 16 micro-batches.
BF16_GRAD_ACCUM = Recipe(
    "gradients accumulated in bf16 (16 micro-batches)",
    dtype=torch.bfloat16,
    micro_batches=16,
    grad_accum_dtype=torch.bfloat16,
)


@dataclass
class Run:
    recipe: str
    seed: int
    losses: list[float]
    #: fp32 loss of the current weights on a fixed evaluation batch, at each checkpoint step
    eval_losses: dict[int, float] = field(default_factory=dict)
    skipped_at: list[int] = field(default_factory=list)
    zero_grad_share: float = 0.0
    scales: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Setup:
    """A training problem: model, data, loss, optimizer and length."""

    name: str
    model: Callable[[int], nn.Module]  # seed -> model
    batch: BatchFn
    loss: LossFn
    steps: int
    lr: float
    optimizer: str = "adamw"
    checkpoint_every: int = 5

    def checkpoints(self) -> list[int]:
        return sorted({*range(self.checkpoint_every - 1, self.steps, self.checkpoint_every), self.steps - 1})


def _optimizer(kind: str, params: Sequence[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


#: Models start from one initialisation; seeds vary the data stream. The seed band is then the
#: run-to-run noise of the data order, the spread a practitioner sees re-running the same model.
INIT_SEED = 0
#: Seed of the fixed evaluation batch (never used for training data, which uses 10_000 + seed).
EVAL_SEED = 99_999


def evaluate(model: nn.Module, setup: Setup, x: torch.Tensor, y: torch.Tensor) -> float:
    """fp32 loss of the model's current weights on a fixed batch (training mode kept: BatchNorm
    uses batch statistics, so no running-statistics drift enters the comparison)."""
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
        params = next(model.parameters())
        out = model(x.to(params.dtype) if x.is_floating_point() else x)
        return float(setup.loss(out.float(), y))


def train(
    setup: Setup,
    recipe: Recipe,
    seed: int = 0,
    device: torch.device | str = "cpu",
    skip_steps: frozenset[int] = frozenset(),
) -> Run:
    """Run ``setup`` with ``recipe``; deterministic for a given seed on a given stack.

    ``skip_steps`` replays a GradScaler's skipped steps on a reference run (no optimizer step there),
    so that parity compares numerics, not the scaler's calibration of its first steps.
    """
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = setup.model(INIT_SEED).to(dev)
    if recipe.params_dtype is not None:
        model = model.to(recipe.params_dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    lr = setup.lr / recipe.loss_factor if setup.optimizer == "sgd" else setup.lr
    opt = _optimizer(setup.optimizer, params, lr)
    scaler = torch.amp.GradScaler(dev.type) if recipe.scaler else None
    gen = torch.Generator().manual_seed(10_000 + seed)
    eval_x, eval_y = setup.batch(0, torch.Generator().manual_seed(EVAL_SEED))
    eval_x, eval_y = eval_x.to(dev), eval_y.to(dev)
    checkpoints = set(setup.checkpoints())
    run = Run(recipe.name, seed, [])
    zero, total = 0, 0
    for step in range(setup.steps):
        x, y = setup.batch(step, gen)
        x, y = x.to(dev), y.to(dev)
        opt.zero_grad(set_to_none=True)
        acc: list[torch.Tensor] | None = None
        step_loss = 0.0
        for xs, ys in zip(x.chunk(recipe.micro_batches), y.chunk(recipe.micro_batches), strict=True):
            with torch.autocast(dev.type, dtype=recipe.dtype or torch.bfloat16, enabled=recipe.dtype is not None):
                out = model(
                    xs.to(recipe.params_dtype) if recipe.params_dtype is not None and xs.is_floating_point() else xs
                )
                loss = setup.loss(out.float(), ys) / recipe.micro_batches
            step_loss += loss.detach().item()
            scaled = loss * recipe.loss_factor * (recipe.static_scale or 1.0)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()  # type: ignore[no-untyped-call]
            if recipe.static_scale is not None or recipe.grad_accum_dtype is not None:
                # each micro-batch's (unscaled) gradient is summed into a buffer of the accumulation dtype
                buf = recipe.grad_accum_dtype or torch.float32
                grads = [
                    (p.grad.float() / (recipe.static_scale or 1.0)).to(buf)
                    if p.grad is not None
                    else torch.zeros_like(p, dtype=buf)
                    for p in params
                ]
                acc = grads if acc is None else [a + g for a, g in zip(acc, grads, strict=True)]
                for p in params:
                    p.grad = None
        if acc is not None:
            for p, a in zip(params, acc, strict=True):
                p.grad = a.to(p.dtype)
        if scaler is not None and recipe.clip is not None:
            scaler.unscale_(opt)
        if recipe.clip is not None:
            torch.nn.utils.clip_grad_norm_(params, recipe.clip)
        grads = [p.grad for p in params if p.grad is not None]
        zero += sum(int((g == 0).sum()) for g in grads)
        total += sum(g.numel() for g in grads)
        if scaler is not None:
            before = scaler.get_scale()
            run.scales.append(before)
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < before:
                run.skipped_at.append(step)
        elif step not in skip_steps:
            opt.step()
        run.losses.append(step_loss)
        if step in checkpoints:
            run.eval_losses[step] = evaluate(model, setup, eval_x, eval_y)
    run.zero_grad_share = zero / max(total, 1)
    return run


# -- parity -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Band:
    """Seed-to-seed spread of fp32 runs at each step: max_s |L_s(t) - L_0(t)|."""

    per_step: dict[int, float]
    seeds: int


def seed_band(runs: Sequence[Run]) -> Band:
    """Per checkpoint, the largest distance of another seed's evaluation loss from seed 0's."""
    ref = runs[0].eval_losses
    return Band({t: max(abs(r.eval_losses[t] - v) for r in runs[1:]) for t, v in ref.items()}, len(runs))


#: An AMP recipe may move the loss curve at most this fraction of what changing the seed does:
#: at the full seed spread it would be indistinguishable from a different seed, not the same run.
PARITY_FRACTION = 0.5
#: A negative control must miss parity by at least this factor of the seed spread somewhere, or the
#: suite is not sensitive enough to tell a broken recipe from seed noise.
CONTROL_FACTOR = 2.0


@dataclass(frozen=True)
class Parity:
    recipe: str
    steps: list[int]
    diffs: list[float]
    allowances: list[float]

    @property
    def ratios(self) -> list[float]:
        return [
            d / a if a > 0 else (math.inf if d > 0 else 0.0) for d, a in zip(self.diffs, self.allowances, strict=True)
        ]

    @property
    def worst(self) -> float:
        return max(self.ratios)

    @property
    def passed(self) -> bool:
        return self.worst <= 1.0


def parity(run: Run, reference: Run, band: Band, fraction: float = PARITY_FRACTION) -> Parity:
    """Evaluation-loss distance of ``run`` from ``reference`` (same seed) at each checkpoint,
    against ``fraction`` of the seed band there."""
    steps = sorted(reference.eval_losses)
    diffs = [
        abs(run.eval_losses[t] - reference.eval_losses[t]) if math.isfinite(run.eval_losses[t]) else math.inf
        for t in steps
    ]
    return Parity(run.recipe, steps, diffs, [fraction * band.per_step[t] for t in steps])


# -- gradient-underflow census ------------------------------------------------------------------
FP16_TINY = FP16.smallest_subnormal  # 2^-24: below half of it a value flushes to zero
FP16_MIN_NORMAL = FP16.smallest_normal  # 2^-14


#: Loss scales of the census: 2^0 .. 2^24 (2^24 lifts fp16's smallest subnormal to 1).
CENSUS_SCALES: tuple[float, ...] = tuple(2.0**e for e in range(25))


def gradient_census(grads: Sequence[torch.Tensor], scales: Sequence[float] = CENSUS_SCALES) -> dict[str, Any]:
    """Shares of fp32 gradient values that fp16 would flush to zero or hold as subnormals, and per
    loss scale S the share still flushed and the share that overflows (|g| S > fp16 max)."""
    g = torch.cat([t.detach().float().abs().flatten() for t in grads]).double()
    n = g.numel()
    nonzero = g[g > 0]
    out: dict[str, Any] = {
        "values": n,
        "exact_zero_share": float((g == 0).sum()) / n,
        "underflow_share": float((nonzero < FP16_TINY / 2).sum()) / n,
        "subnormal_share": float(((nonzero >= FP16_TINY / 2) & (nonzero < FP16_MIN_NORMAL)).sum()) / n,
        "log2_quantiles": {q: float(torch.log2(nonzero.quantile(q))) for q in (0.01, 0.5, 0.99)}
        if nonzero.numel()
        else {},
        "per_scale": [],
    }
    for s in scales:
        scaled = nonzero * s
        out["per_scale"].append(
            {
                "scale_log2": round(math.log2(s)),
                "underflow_share": float((scaled < FP16_TINY / 2).sum()) / n,
                "recovered_share": out["underflow_share"] - float((scaled < FP16_TINY / 2).sum()) / n,
                "overflow_share": float((scaled > FP16.max).sum()) / n,
            }
        )
    return out


# -- models and data ------------------------------------------------------------------------------
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


def fp32_gradients(
    setup: Setup, seed: int = 0, warmup_steps: int = 5, device: torch.device | str = "cpu"
) -> list[torch.Tensor]:
    """fp32 parameter gradients after a few fp32 steps (the census input)."""
    torch.manual_seed(seed)
    model = setup.model(INIT_SEED).to(device)
    opt = _optimizer(setup.optimizer, list(model.parameters()), setup.lr)
    gen = torch.Generator().manual_seed(10_000 + seed)
    for step in range(warmup_steps + 1):
        x, y = setup.batch(step, gen)
        opt.zero_grad()
        setup.loss(model(x.to(device)), y.to(device)).backward()  # type: ignore[no-untyped-call]
        if step < warmup_steps:
            opt.step()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def lm_gradients(seed: int = 0) -> list[torch.Tensor]:
    """The tiny language model's fp32 gradients after 5 steps."""
    return fp32_gradients(SETUPS["tiny_lm"], seed)


# -- the checks, as one call ----------------------------------------------------------------------
@dataclass
class RecipeResult:
    recipe: Recipe
    run: Run
    reference: Run
    parity: Parity


@dataclass
class ParityReport:
    setup: str
    band: Band
    fp32_runs: list[Run]
    results: list[RecipeResult]


def check_parity(
    setup: Setup,
    recipes: Sequence[Recipe],
    seeds: int = 3,
    device: torch.device | str = "cpu",
    fp32_runs: Sequence[Run] | None = None,
) -> ParityReport:
    """Run fp32 over ``seeds`` seeds (the band), each recipe on seed 0, and each recipe's fp32
    counterpart on seed 0 with the recipe's skipped steps replayed; compare at the checkpoints."""
    if seeds < 2:
        raise ValueError(f"a seed band needs at least 2 seeds, got {seeds}")
    fp = list(fp32_runs) if fp32_runs is not None else [train(setup, FP32, s, device) for s in range(seeds)]
    band = seed_band(fp)
    results = []
    for recipe in recipes:
        run = train(setup, recipe, 0, device)
        cp = recipe.fp32_counterpart()
        plain = cp.micro_batches == 1 and cp.clip is None and cp.loss_factor == 1.0
        ref = fp[0] if plain and not run.skipped_at else train(setup, cp, 0, device, frozenset(run.skipped_at))
        results.append(RecipeResult(recipe, run, ref, parity(run, ref, band)))
    return ParityReport(setup.name, band, fp, results)


def is_deterministic(setup: Setup, recipe: Recipe, device: torch.device | str = "cpu") -> tuple[bool, int | None]:
    """Run the recipe twice; (bitwise-identical losses?, first differing step)."""
    a, b = train(setup, recipe, 0, device), train(setup, recipe, 0, device)
    for t, (x, y) in enumerate(zip(a.losses, b.losses, strict=True)):
        if x != y and not (math.isnan(x) and math.isnan(y)):
            return False, t
    return True, None
