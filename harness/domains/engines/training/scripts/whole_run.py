"""A whole training run, standalone: the model, its initial weights and batches, trained under the
recipe (autocast, micro-batches, clipping after unscaling, a loss factor, a static loss scale,
micro-batch gradients summed in buffers of their own dtype, GradScaler with overflow injected
inside the forward pass), eagerly or through ``torch.compile``; then judged against fp32 (parity),
a stored curve, the same run again (determinism) or float64 (precision).

amp-harness writes a failed check's model, inputs and values over the defaults below and keeps the
blocks its check needs (``harness.domains.engines.training.whole_run``). As it lies here it trains a small MLP
and runs every judgement. ``train`` is held to the harness's own loop bit for bit by
tests/test_whole_run_scripts.py.
"""

import math
import statistics
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

# -- model --


def mlp(seed: int) -> nn.Module:  # the default model: a small MLP regression
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1))


LOSS: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.mse_loss

# -- inputs --
# the default data: one data order of STEPS batches (xs0, ys0), the evaluation batch (ex, ey)
_gen = torch.Generator().manual_seed(0)
xs0, ys0 = torch.randn(6, 16, 8, generator=_gen), torch.randn(6, 16, 1, generator=_gen)
ex, ey = torch.randn(16, 8, generator=_gen), torch.randn(16, 1, generator=_gen)
WEIGHTS = mlp(0).state_dict()

# -- parameters --
MODEL = mlp  # builds the model from a seed
INIT_SEED = 0
DEVICE = "cpu"
BACKEND: str | None = None  # torch.compile's backend for the run under test (None: eager)
STEPS = 6
LR = 0.02
WD = 0.0
OPTIMIZER = "sgd"  # sgd (momentum 0.9, lr / LOSS_FACTOR), adamw or adam
SCALER = False  # fp16 with torch's GradScaler
OVERFLOW: list[int] = []  # steps whose forward pass overflows inside the (compiled) graph
CHECKPOINTS: list[int] = [2, 5]  # where the evaluation loss is taken
MICRO = 2  # micro-batches per step
CLIP: float | None = 1.0  # clip_grad_norm_'s max norm
# every run: loss x LOSS_FACTOR (gradients that small; SGD's lr / LOSS_FACTOR: the same training);
# the run under test: loss x STATIC (a static loss scale), each micro-batch's gradient divided by
# it into a buffer of dtype ACCUM (float32 where only STATIC is set), the buffers summed
LOSS_FACTOR = 1.0
STATIC: float | None = None
ACCUM: torch.dtype | None = None
BATCHES = [(xs0, ys0)]  # each data order's batches, by seed

# -- trainer --
COMPILED = BACKEND is not None  # the model compiled for the run under test
Losses = dict[int, float]
ScalerState = tuple[list[float], list[int], float | None]


def make_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    if OPTIMIZER == "sgd":
        return torch.optim.SGD(params, lr=LR / LOSS_FACTOR, momentum=0.9, weight_decay=WD)
    if OPTIMIZER == "adamw":
        return torch.optim.AdamW(params, lr=LR, weight_decay=WD)
    return torch.optim.Adam(params, lr=LR, weight_decay=WD)


def overflow_gate(model: nn.Module) -> torch.Tensor:
    """The first module with parameters: its output times a gate (filled with inf to overflow)."""
    first = next(m for m in model.modules() if next(m.parameters(recurse=False), None) is not None)
    gate, inner = torch.ones((), device=DEVICE), first.forward
    first.forward = lambda *a, **k: inner(*a, **k) * gate
    return gate


def as64(t: torch.Tensor, fp64: bool) -> torch.Tensor:  # floating inputs in float64 for the float64 run
    return t.double() if fp64 and t.is_floating_point() else t


def train(
    dtype: torch.dtype | None, compiled: bool, skip: Sequence[int] = (), seed: int = 0
) -> tuple[Losses, ScalerState, list[float]]:
    """Eval losses at the checkpoints, the scaler's (scales, skipped steps, final scale), training
    losses; ``dtype`` float64: the problem in float64, no autocast; None: fp32."""
    fp64 = dtype == torch.float64
    dtype = None if fp64 else dtype  # the autocast dtype (None: none)
    xs, ys = BATCHES[seed]
    torch.manual_seed(seed)
    model = MODEL(INIT_SEED)
    model.load_state_dict(WEIGHTS)
    model = model.to(DEVICE).double() if fp64 else model.to(DEVICE)
    params = [p for p in model.parameters() if p.requires_grad]
    gate = overflow_gate(model) if OVERFLOW and dtype is not None else None
    torch._dynamo.reset()
    forward = torch.compile(model, backend=BACKEND or "inductor") if compiled else model
    opt = make_optimizer(params)
    scaler = torch.amp.GradScaler(DEVICE) if SCALER and dtype is not None else None
    static, buf = (STATIC, ACCUM or torch.float32) if dtype is not None and (STATIC or ACCUM) else (None, None)
    evals: Losses = {}
    scales: list[float] = []
    skipped: list[int] = []
    losses: list[float] = []
    for step in range(STEPS):
        if gate is not None:
            gate.fill_(math.inf if step in OVERFLOW else 1.0)
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        acc: list[torch.Tensor] | None = None
        for x, y in zip(as64(xs[step], fp64).chunk(MICRO), as64(ys[step], fp64).chunk(MICRO), strict=True):
            with torch.autocast(DEVICE, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = forward(x.to(DEVICE))
                loss = LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), y.to(DEVICE)) / MICRO
            step_loss += loss.detach().item()
            loss = loss * LOSS_FACTOR * (static or 1.0)
            torch.autograd.backward(scaler.scale(loss) if scaler else loss)
            if buf is not None:  # this micro-batch's gradient, unscaled, into the buffers
                g = [
                    (p.grad.float() / (static or 1.0)).to(buf) if p.grad is not None else torch.zeros_like(p, dtype=buf)
                    for p in params
                ]
                acc = g if acc is None else [a + b for a, b in zip(acc, g, strict=True)]
                for p in params:
                    p.grad = None
        for p, a in zip(params, acc or [], strict=False):
            p.grad = a.to(p.dtype)
        losses.append(step_loss)
        if CLIP is not None:  # unscaled first, then clipped, as the recipe does
            if scaler:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, CLIP)
        if scaler:
            scales.append(scaler.get_scale())
            scaler.step(opt)
            scaler.update()
            if scaler.get_scale() < scales[-1]:
                skipped.append(step)
        elif step not in skip:
            opt.step()
        if step in CHECKPOINTS:
            with torch.no_grad():
                evals[step] = float(LOSS(model(as64(ex, fp64).to(DEVICE)), as64(ey, fp64).to(DEVICE)))
    return evals, (scales, skipped, scaler.get_scale() if scaler else None), losses


# -- parity --
LOW = torch.bfloat16  # the recipe's autocast dtype
# half the fp32 seed band per checkpoint: the median distance between the eval losses of fp32 seeds
# (other data orders), measured by the check
ALLOWED = {2: 0.05, 5: 0.05}
run, run_scaler = train(LOW, compiled=COMPILED)[:2]
fp32 = train(None, compiled=False, skip=run_scaler[1])[0]  # reference: fp32, skipped steps replayed
references = [("fp32", fp32)]
if COMPILED:  # compiled AMP against eager AMP too, whose GradScaler state it must equal exactly
    eager, eager_scaler = train(LOW, compiled=False)[:2]
    references.append(("eager", eager))
    if run_scaler != eager_scaler:
        print(f"GradScaler (scales, skipped steps, final scale): compiled {run_scaler}, eager {eager_scaler}")
worst = math.inf if COMPILED and run_scaler != eager_scaler else 0.0
for t, a in ALLOWED.items():
    for name, ref in references:
        d = abs(run[t] - ref[t])
        worst = max(worst, d / a if d == d else math.inf)
        print(
            f"step {t}: {'compiled' if COMPILED else 'AMP'} {run[t]:.6g}, {name} {ref[t]:.6g}, |diff| {d:.3g} (allowed {a:.3g})"
        )
measured: float = worst  # the worst |diff| over its allowance
allowed: float = 1.0

# -- curve --
DTYPE: torch.dtype | None = torch.bfloat16  # the run's autocast dtype (None: fp32)
# reference: the golden curve the harness stored from a run
STORED: list[float] = train(DTYPE, compiled=False)[2]
ALLOWANCE = [0.0] * STEPS
MAX_OUTLIERS = 0
MAX_RUN: int | None = None
losses = train(DTYPE, compiled=False)[2]
outside = [
    t for t, (got, want, a) in enumerate(zip(losses, STORED, ALLOWANCE, strict=True)) if not abs(got - want) <= a
]
for t in outside[:12]:
    print(f"step {t}: loss {losses[t]!r}, stored {STORED[t]!r} (allowed |diff| {ALLOWANCE[t]:.3g})")
longest = max((len(r) for r in "".join("x" if t in outside else " " for t in range(STEPS)).split()), default=0)
print(f"{len(outside)} of {STEPS} steps outside their allowance (at most {MAX_OUTLIERS}), longest run {longest}")
measured = len(outside) if MAX_RUN is None or longest <= MAX_RUN else math.inf  # steps outside
allowed = MAX_OUTLIERS

# -- determinism --
DTYPE = torch.bfloat16  # the run's autocast dtype (None: fp32)
# reference: the same run made again in this process
torch.use_deterministic_algorithms(DEVICE == "cuda")  # as the check runs it
first = train(DTYPE, compiled=False)[2]
second = train(DTYPE, compiled=False)[2]
differ = [t for t, (a, b) in enumerate(zip(first, second, strict=True)) if a != b and not (a != a and b != b)]
for t in differ[:12]:
    print(f"step {t}: loss {first[t]!r}, then {second[t]!r}")
print(
    f"{len(differ)} of {STEPS} steps' losses differ between the two runs"
    + (f", from step {differ[0]}" if differ else "")
)
measured = len(differ)  # steps whose loss differs
allowed = 0

# -- precision --
LOW = torch.bfloat16  # the recipe's autocast dtype
FRACTION = (2.0**-24 / 2.0**-8) ** 0.5  # sqrt(u_fp32 / u_low): fp32 losing about half its extra bits fails
ratios: list[float] = []
for seed in range(len(BATCHES)):
    ref = train(torch.float64, compiled=False, seed=seed)[0]  # reference: the problem in float64
    d32 = max(abs(train(None, compiled=False, seed=seed)[0][t] - ref[t]) for t in CHECKPOINTS)
    dlow = max(abs(train(LOW, compiled=False, seed=seed)[0][t] - ref[t]) for t in CHECKPOINTS)
    ratios.append(d32 / dlow if dlow > 0 else (0.0 if d32 == 0 else math.inf))
    print(f"data order {seed}: fp32 {d32:.3g} from float64, {LOW} {dlow:.3g}: ratio {ratios[-1]:.3g}")
measured = statistics.median(ratios)  # the median ratio over the data orders
allowed = FRACTION
