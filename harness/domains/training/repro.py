"""A failed claim about a whole training run as a standalone script: the run itself.

Where no single op of a step leaves its budget (the op localiser's script), where Inductor fuses
the ops a dispatch mode would see (compiled training), where a run left its golden curve, or where
fp32 drifted from float64, the smallest faithful script is the run itself: the built-in model's
source, its initial weights and the run's batches saved beside the script, trained under the
recipe (autocast, micro-batches, clipping, a loss factor, a static loss scale, micro-batch
gradients summed in buffers of their own dtype, GradScaler with any overflow injected inside the
forward pass), eagerly or through ``torch.compile`` and then also eagerly, and in fp32 (or
float64) as the reference, or against the stored curve. The allowance is the check's: half the
fp32 seed band at each checkpoint, or the golden-curve lane's rule, measured seed-to-seed spreads
written into the script with their origin (re-deriving them would mean training every seed).
A failed AMP lane judges steps, not the run: its script is those steps, each from the run's
state saved beside it, taken by the recipe, in float64 and correctly rounded (the lane's
emulation written out), against the lane's factor. The gradient census's scaler claim is one
GradScaler step from the census's state.
Your own models, emulated recipes (the harness's float64 rounding mode), setups with a
schedule, an optimizer factory or a scaler of their own, and compile backend functions keep no
script: the script would need code it cannot carry.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

import torch

from harness.domains.op_prints import OpPrint
from harness.domains.repro import FailureRepro, upcast_src
from harness.domains.training.amp_lane import FP16_HEADROOM, LANE_FACTOR, MAX_BACKOFF, lane_dtype
from harness.domains.training.census import census_state
from harness.domains.training.loop import Run
from harness.domains.training.parity import PARITY_FRACTION, Band
from harness.domains.training.recipes import DATA_SEED_OFFSET, EVAL_SEED, FP32, INIT_SEED, Recipe, Setup
from harness.numerics.formats import format_of


def _sources(fn: Callable[..., Any]) -> str | None:
    """``fn``'s source and that of the classes and functions of its module it reaches (a model's
    modules), dependencies first; None where some source cannot be read."""
    module = inspect.getmodule(fn)
    if module is None:
        return None
    parts: list[str] = []
    seen: set[int] = set()
    todo: list[Any] = [fn]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        try:
            src = textwrap.dedent(inspect.getsource(obj))
        except (OSError, TypeError):
            return None
        parts.append(src.rstrip())
        for name in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", src)):
            v = getattr(module, name, None)
            if (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == module.__name__:
                todo.append(v)
    return "\n\n\n".join(reversed(parts))


def _loss_source(loss: Callable[..., Any]) -> str | None:
    """``LOSS``: a ``torch.nn.functional`` loss by name, else its source renamed."""
    if getattr(loss, "__module__", None) == "torch.nn.functional":
        return f"LOSS = F.{loss.__name__}"
    src = _sources(loss)
    return None if src is None else f"{src}\n\n\nLOSS = {loss.__name__}"


#: where the built-in models live: a model of yours needs your code (imports, constants) a script
#: cannot carry
BUILT_IN = "harness.domains.training.models"


def unsupported(setup: Setup, recipe: Recipe, backend: Any = None) -> str | None:
    """Why no script can reproduce this run standalone, or None (``backend``: the compile
    backend of a compiled run)."""
    if backend is not None and not isinstance(backend, str):
        return "a backend function of your own"
    if getattr(setup.model, "__module__", None) != BUILT_IN:
        return "a model of your own"
    if not isinstance(setup.optimizer, str) or setup.schedule is not None or setup.scaler is not None:
        return "an optimizer factory, schedule or scaler of the setup's own"
    if any(v is not None for v in (recipe.emulate, recipe.params_dtype, recipe.grad_noise)):
        return f"recipe {recipe.name}: an emulation, low-precision parameters or injected gradient noise"
    # a subclass's own forward (by name: the harness's modules may have been imported twice)
    own_forward = any("forward" in vars(k) for k in type(setup).__mro__ if k.__name__ != Setup.__name__)
    if setup.loss is None or own_forward:
        return "a model's own loss or forward"
    return None


def repro_of(
    setup: Setup,
    recipe: Recipe,
    band: Band,
    device: torch.device,
    *,
    backend: Any = None,
    overflow: frozenset[int] = frozenset(),
) -> FailureRepro | None:
    """The whole run against fp32, and, compiled with ``backend`` (a name; a backend function of
    your own has no script), against eager too (None: see
    :func:`unsupported`, or a model or loss whose source cannot be read, or batches that are not
    two tensors)."""

    allowed = {t: PARITY_FRACTION * band.per_step[t] for t in sorted(band.per_step)}
    trainer = _trainer(setup, recipe, device, backend, overflow, sorted(allowed))
    if trainer is None:
        return None
    prelude, tensors = trainer
    low = str(recipe.dtype).removeprefix("torch.")
    code = f"""{prelude}
# half the fp32 seed band per checkpoint: the median distance between the eval losses of {band.seeds}
# fp32 seeds (other data orders), measured by the check
ALLOWED = {allowed!r}
run, run_scaler, _ = train(torch.{low}, compiled=COMPILED)
fp32, _, _ = train(None, compiled=False, skip=run_scaler[1])  # reference: fp32, skipped steps replayed
references = [("fp32", fp32)]
if COMPILED:  # compiled AMP against eager AMP too, whose GradScaler state it must equal exactly
    eager, eager_scaler, _ = train(torch.{low}, compiled=False)
    references.append(("eager", eager))
    if run_scaler != eager_scaler:
        print(f"GradScaler (scales, skipped steps, final scale): compiled {{run_scaler}}, eager {{eager_scaler}}")
worst = math.inf if COMPILED and run_scaler != eager_scaler else 0.0
for t, a in ALLOWED.items():
    for name, ref in references:
        d = abs(run[t] - ref[t])
        worst = max(worst, d / a if d == d else math.inf)
        print(f"step {{t}}: {{'compiled' if COMPILED else 'AMP'}} {{run[t]:.6g}}, {{name}} {{ref[t]:.6g}}, |diff| {{d:.3g}} (allowed {{a:.3g}})")
measured = worst  # the worst |diff| over its allowance
allowed = 1.0"""
    what = (
        f"{setup.name} trained {setup.steps} steps under {recipe.name} with the model compiled ({backend}): "
        "eval losses against eager AMP and fp32, and the GradScaler's state against eager"
        if backend is not None
        else f"{setup.name} trained {setup.steps} steps under {recipe.name}: eval losses against fp32"
    )
    return FailureRepro(
        "compiled" if backend is not None else "training",
        what,
        code,
        f"{PARITY_FRACTION} x the fp32 seed band (median pairwise distance of {band.seeds} seeds' eval losses), "
        "measured by the check" + ("; the scaler's state exactly" if backend is not None else ""),
        tensors,
        device=str(device),
    )


def _eager(setup: Setup, recipe: Recipe, device: torch.device) -> tuple[str, dict[str, torch.Tensor], str] | None:
    """The eager run's trainer (:func:`_trainer`, no checkpoints), its tensors, and the recipe's
    autocast dtype as source (``None``: fp32)."""
    trainer = _trainer(setup, recipe, device, None, frozenset(), [])
    if trainer is None:
        return None
    dtype = "None" if recipe.dtype is None else f"torch.{str(recipe.dtype).removeprefix('torch.')}"
    return trainer[0], trainer[1], dtype


def curve_repro_of(
    setup: Setup,
    recipe: Recipe,
    stored: list[float],
    allowance: list[float],
    max_outliers: int,
    max_run: int | None,
    lane: str,
    device: torch.device,
) -> FailureRepro | None:
    """The whole run's per-step training losses against a stored golden curve: each step within its
    allowance (0: bitwise), up to ``max_outliers`` steps excepted, at most ``max_run`` in a row."""

    eager = _eager(setup, recipe, device)
    if eager is None:
        return None
    prelude, tensors, dtype = eager
    code = f"""{prelude}
# reference: the golden curve the harness stored from a run ({lane})
STORED = {stored!r}
ALLOWANCE = {allowance!r}
MAX_OUTLIERS, MAX_RUN = {max_outliers!r}, {max_run!r}
_, _, losses = train({dtype}, compiled=False)
outside = [t for t, (got, want, a) in enumerate(zip(losses, STORED, ALLOWANCE)) if not abs(got - want) <= a]
for t in outside[:12]:
    print(f"step {{t}}: loss {{losses[t]!r}}, stored {{STORED[t]!r}} (allowed |diff| {{ALLOWANCE[t]:.3g}})")
longest = max((len(r) for r in "".join("x" if t in outside else " " for t in range(STEPS)).split()), default=0)
print(f"{{len(outside)}} of {{STEPS}} steps outside their allowance (at most {{MAX_OUTLIERS}}), longest run {{longest}}")
measured = len(outside) if MAX_RUN is None or longest <= MAX_RUN else math.inf  # steps outside
allowed = MAX_OUTLIERS"""
    return FailureRepro(
        "training",
        f"{setup.name} trained {setup.steps} steps under {recipe.name}: per-step training losses against its golden "
        "curve",
        code,
        lane,
        tensors,
        device=str(device),
    )


def determinism_repro_of(setup: Setup, recipe: Recipe, device: torch.device) -> FailureRepro | None:
    """The run made twice in one process, as the determinism check makes it: every step's training
    loss bitwise the same (a NaN equal to a NaN); on CUDA with deterministic algorithms, as there."""

    eager = _eager(setup, recipe, device)
    if eager is None:
        return None
    prelude, tensors, dtype = eager
    code = f"""{prelude}


# reference: the same run made again in this process
torch.use_deterministic_algorithms(DEVICE == "cuda")  # as the check runs it
_, _, first = train({dtype}, compiled=False)
_, _, second = train({dtype}, compiled=False)
differ = [t for t, (a, b) in enumerate(zip(first, second)) if a != b and not (a != a and b != b)]
for t in differ[:12]:
    print(f"step {{t}}: loss {{first[t]!r}}, then {{second[t]!r}}")
print(f"{{len(differ)}} of {{STEPS}} steps' losses differ between the two runs" + (f", from step {{differ[0]}}" if differ else ""))
measured = len(differ)  # steps whose loss differs
allowed = 0"""
    return FailureRepro(
        "training",
        f"{setup.name} trained {setup.steps} steps under {recipe.name} twice: per-step training losses bitwise equal",
        code,
        "0: a rerun of the same seed gives bitwise-identical losses (determinism, not a tolerance)",
        tensors,
        device=str(device),
    )


def model_source(setup: Setup) -> str | None:
    """The script's model classes and ``LOSS`` (None where a source cannot be read)."""
    model_src, loss_src = _sources(setup.model), _loss_source(setup.loss) if setup.loss else None
    if model_src is None or loss_src is None:
        return None
    return f"{model_src}\n\n\n{loss_src}"


def model_prelude(
    setup: Setup, weights: dict[str, torch.Tensor], batch: tuple[Any, Any], device: torch.device
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """A script's opening for one step of a built-in model: its source, ``model_at()`` (the model
    with ``weights``, saved beside the script, on the device) and ``loss_of(model, low)`` (the loss
    of the batch ``x, y`` under autocast to ``low``; None: fp32). None: see :func:`unsupported`, a
    source that cannot be read, or a batch that is not two tensors."""

    source = model_source(setup)
    if unsupported(setup, FP32) is not None or source is None:
        return None
    if not all(isinstance(t, torch.Tensor) for t in batch):
        return None
    names = list(weights)
    tensors = {f"w{i}": weights[k].detach().clone() for i, k in enumerate(names)}
    tensors.update(x=batch[0], y=batch[1])
    code = f"""from torch import nn

{source}
WEIGHTS = dict(zip({names!r}, [{", ".join(f"w{i}" for i in range(len(names)))}]))
MODEL, INIT_SEED, DEVICE = {setup.model.__name__}, {INIT_SEED}, {device.type!r}


def model_at():  # the model with WEIGHTS, on DEVICE
    model = MODEL(INIT_SEED)
    model.load_state_dict(WEIGHTS)
    return model.to(DEVICE)


def loss_of(model, low):  # the loss of the batch (x, y), under autocast to low (None: fp32)
    with torch.autocast(DEVICE, dtype=low or torch.bfloat16, enabled=low is not None):
        out = model(x.to(DEVICE))
        return LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), y.to(DEVICE))
"""
    return code, tensors


def _trainer(
    setup: Setup,
    recipe: Recipe,
    device: torch.device,
    backend: Any,
    overflow: frozenset[int],
    checkpoints: list[int],
    seeds: int = 1,
) -> tuple[str, dict[str, torch.Tensor]] | None:
    """The script's model, data (the batches of data orders ``0..seeds-1``) and
    ``train(dtype, compiled, skip, seed)`` -> (eval losses at ``checkpoints``, the scaler's (scales,
    skipped steps, final scale), per-step training losses); ``dtype`` float64: the problem in
    float64, as the precision lane trains it. None where the run cannot stand alone."""
    if unsupported(setup, recipe, backend) is not None:
        return None
    source = model_source(setup)
    orders = []
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
        orders.append([setup.batch(step, gen) for step in range(setup.steps)])
    eval_batch = setup.batch(0, torch.Generator().manual_seed(EVAL_SEED))
    if source is None:
        return None
    if not all(isinstance(t, torch.Tensor) for batches in orders for b in (*batches, eval_batch) for t in b):
        return None
    weights = setup.model(INIT_SEED).state_dict()
    names = list(weights)
    tensors: dict[str, torch.Tensor] = {f"w{i}": weights[k].detach().clone() for i, k in enumerate(names)}
    for seed, batches in enumerate(orders):
        tensors[f"xs{seed}"] = torch.stack([b[0] for b in batches])
        tensors[f"ys{seed}"] = torch.stack([b[1] for b in batches])
    tensors.update(ex=eval_batch[0], ey=eval_batch[1])
    opt = {
        "sgd": "torch.optim.SGD(params, lr=LR / LOSS_FACTOR, momentum=0.9, weight_decay=WD)",
        "adamw": "torch.optim.AdamW(params, lr=LR, weight_decay=WD)",
        "adam": "torch.optim.Adam(params, lr=LR, weight_decay=WD)",
    }.get(str(setup.optimizer))
    accum = None if recipe.grad_accum_dtype is None else f"torch.{str(recipe.grad_accum_dtype).removeprefix('torch.')}"
    if opt is None:
        return None
    code = f"""from torch import nn

{source}
WEIGHTS = dict(zip({names!r}, [{", ".join(f"w{i}" for i in range(len(names)))}]))
DEVICE, BACKEND, STEPS, LR, WD = {device.type!r}, {backend!r}, {setup.steps}, {setup.lr!r}, {setup.weight_decay!r}
COMPILED = BACKEND is not None  # the model compiled for the run under test
SCALER = {recipe.scaler!r}  # fp16 with torch's GradScaler
OVERFLOW = {sorted(overflow)!r}  # steps whose forward pass overflows inside the (compiled) graph
CHECKPOINTS = {checkpoints!r}  # where the evaluation loss is taken
MICRO, CLIP = {recipe.micro_batches}, {recipe.clip!r}  # micro-batches per step, clip_grad_norm_'s max norm
# every run: loss x LOSS_FACTOR (gradients that small; SGD's lr / LOSS_FACTOR: the same training);
# the run under test: loss x STATIC (a static loss scale), each micro-batch's gradient divided by
# it into a buffer of dtype ACCUM (float32 where only STATIC is set), the buffers summed
LOSS_FACTOR, STATIC, ACCUM = {recipe.loss_factor!r}, {recipe.static_scale!r}, {accum}
BATCHES = [{", ".join(f"(xs{s}, ys{s})" for s in range(seeds))}]  # each data order's batches, by seed


def overflow_gate(model):  # the first module with parameters: its output times a gate (inf to overflow)
    first = next(m for m in model.modules() if next(m.parameters(recurse=False), None) is not None)
    gate, inner = torch.ones((), device=DEVICE), first.forward
    first.forward = lambda *a, **k: inner(*a, **k) * gate
    return gate


def as64(t, fp64):  # floating inputs in float64 for the float64 run (token ids untouched)
    return t.double() if fp64 and t.is_floating_point() else t


def train(dtype, compiled, skip=(), seed=0):  # eval losses at the checkpoints, the scaler's state, training losses
    fp64 = dtype == torch.float64  # the problem in float64, no autocast
    dtype = None if fp64 else dtype  # the autocast dtype (None: none)
    xs, ys = BATCHES[seed]
    torch.manual_seed(seed)
    model = {setup.model.__name__}({INIT_SEED})
    model.load_state_dict(WEIGHTS)
    model = model.to(DEVICE).double() if fp64 else model.to(DEVICE)
    params = [p for p in model.parameters() if p.requires_grad]
    gate = overflow_gate(model) if OVERFLOW and dtype is not None else None
    torch._dynamo.reset()
    forward = torch.compile(model, backend=BACKEND) if compiled else model
    opt = {opt}
    scaler = torch.amp.GradScaler(DEVICE) if SCALER and dtype is not None else None
    static, buf = (STATIC, ACCUM or torch.float32) if dtype is not None and (STATIC or ACCUM) else (None, None)
    evals, scales, skipped, losses = {{}}, [], [], []
    for step in range(STEPS):
        if gate is not None:
            gate.fill_(math.inf if step in OVERFLOW else 1.0)
        opt.zero_grad(set_to_none=True)
        step_loss, acc = 0.0, None
        for x, y in zip(as64(xs[step], fp64).chunk(MICRO), as64(ys[step], fp64).chunk(MICRO)):
            with torch.autocast(DEVICE, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                out = forward(x.to(DEVICE))
                loss = LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), y.to(DEVICE)) / MICRO
            step_loss += loss.detach().item()
            loss = loss * LOSS_FACTOR * (static or 1.0)
            (scaler.scale(loss) if scaler else loss).backward()
            if buf is not None:  # this micro-batch's gradient, unscaled, into the buffers
                g = [(p.grad.float() / (static or 1.0)).to(buf) if p.grad is not None else torch.zeros_like(p, dtype=buf) for p in params]
                acc = g if acc is None else [a + b for a, b in zip(acc, g)]
                for p in params:
                    p.grad = None
        for p, a in zip(params, acc or []):
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
    return evals, (scales, skipped, scaler.get_scale() if scaler else None), losses"""
    return code, tensors


def precision_repro_of(
    setup: Setup, recipe: Recipe, seeds: int, fraction: float, origin: str, device: torch.device
) -> FailureRepro | None:
    """fp32 against a float64 run of the same problem, per data order, against ``recipe``'s
    (bf16 autocast's) distance from it: the median ratio over ``seeds`` orders at most ``fraction``."""

    checkpoints = setup.checkpoints()
    trainer = _trainer(setup, recipe, device, None, frozenset(), checkpoints, seeds)
    if trainer is None:
        return None
    prelude, tensors = trainer
    low = str(recipe.dtype).removeprefix("torch.")
    code = f"""{prelude}
FRACTION = {fraction!r}  # sqrt(u_fp32 / u_{low}): fp32 losing about half its extra bits fails
ratios = []
for seed in range(len(BATCHES)):
    ref = train(torch.float64, compiled=False, seed=seed)[0]  # reference: the problem in float64
    d32 = max(abs(train(None, compiled=False, seed=seed)[0][t] - ref[t]) for t in CHECKPOINTS)
    dlow = max(abs(train(torch.{low}, compiled=False, seed=seed)[0][t] - ref[t]) for t in CHECKPOINTS)
    ratios.append(d32 / dlow if dlow > 0 else (0.0 if d32 == 0 else math.inf))
    print(f"data order {{seed}}: fp32 {{d32:.3g}} from float64, {low} {{dlow:.3g}}: ratio {{ratios[-1]:.3g}}")
measured = __import__("statistics").median(ratios)  # the median ratio over the data orders
allowed = FRACTION"""
    return FailureRepro(
        "training",
        f"{setup.name}: fp32's distance from a float64 run of the same training, against {low} autocast's, median "
        f"over {seeds} data orders",
        code,
        origin,
        tensors,
        device=str(device),
    )


#: The AMP lane's step, three ways, written out beside :func:`harness.domains.training.loop.step_from`
#: and :mod:`harness.domains.training.emulation` (tests/test_whole_run_scripts.py holds it to them
#: bit for bit): the recipe under autocast with attention correctly rounded, the exact step in
#: float64, and the step correctly rounded to the format in float64 with fp32 master weights.
_LANE_STEP = """

class Round(torch.autograd.Function):  # to LOW in the forward pass, the incoming gradient too
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.to(dtype).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.dtype).to(grad.dtype), None


def rounded(x, dtype):  # a float64 tensor rounded to nearest even in dtype; anything else as it is
    return Round.apply(x, dtype) if isinstance(x, torch.Tensor) and x.dtype == torch.float64 else x


# the functions autocast runs in low precision (PyTorch's autocast test lists), as models call them
LOW_PRECISION = {F.linear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d,
                 F.conv_transpose3d, F.scaled_dot_product_attention, torch.matmul, torch.mm, torch.bmm,
                 torch.addmm, torch.baddbmm, torch.addbmm, torch.Tensor.matmul, torch.Tensor.__matmul__,
                 torch.Tensor.mm, torch.Tensor.bmm}


def attention(dtype, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    # correctly rounded: both GEMMs take and give values rounded to dtype, the softmax is exact
    q, k, v = (rounded(t, dtype) for t in (q, k, v))
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
    factor = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = rounded(torch.matmul(q, k.transpose(-2, -1)) * factor, dtype)
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else scores + attn_mask
    return rounded(torch.matmul(rounded(torch.softmax(scores, dim=-1), dtype), v), dtype)


class Emulated(TorchFunctionMode):  # a float64 model's low-precision calls rounded as correct autocast rounds
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in LOW_PRECISION:
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            return attention(LOW, *args, **kwargs)
        args, kwargs = [rounded(a, LOW) for a in args], {k: rounded(v, LOW) for k, v in kwargs.items()}
        return rounded(func(*args, **kwargs), LOW)


class CorrectAttention(TorchFunctionMode):  # autocast's attention correctly rounded: its kernel is judged apart
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention or args[0].dtype not in (torch.bfloat16, torch.float16):
            return func(*args, **kwargs)
        wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        if isinstance(kwargs.get("attn_mask"), torch.Tensor) and kwargs["attn_mask"].is_floating_point():
            kwargs["attn_mask"] = kwargs["attn_mask"].double()
        return attention(args[0].dtype, *wide, **kwargs).to(args[0].dtype)


def flat(params):
    return torch.cat([p.detach().double().flatten() for p in params])


def step(t, kind, scale=None):  # from state t: "amp" (the recipe), "float64" (exact), "emulated" (correctly rounded)
    weights, opt_state, (x, y), run_scale = STATES[t]
    amp, emulated = kind == "amp", kind == "emulated"
    model = MODEL(INIT_SEED) if amp else MODEL(INIT_SEED).double()
    model.load_state_dict(weights)
    model = model.to(DEVICE).eval()  # dropout off: masks drawn in different dtypes differ
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.train()  # batch statistics, as in training
    params = [p for p in model.parameters() if p.requires_grad]
    opt = OPTIMIZER(params, lr=0.0)
    opt.load_state_dict({"state": {i: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                                   for i, s in opt_state.items()}, "param_groups": GROUPS})
    scaler = torch.amp.GradScaler(DEVICE, init_scale=run_scale or 2.0**16) if SCALER and amp else None
    static, accum = (STATIC, ACCUM) if amp else (scale, None)
    if not amp:  # the problem in float64
        x, y = (t_.double() if t_.is_floating_point() else t_ for t_ in (x, y))
    before = flat(params)
    opt.zero_grad(set_to_none=True)
    acc = None
    for xm, ym in zip(x.chunk(MICRO), y.chunk(MICRO)):
        with torch.autocast(DEVICE, dtype=LOW, enabled=amp), Emulated() if emulated else CorrectAttention():
            out = model(xm.to(DEVICE))
            loss = LOSS(out if out.dtype in (torch.float32, torch.float64) else out.float(), ym.to(DEVICE)) / MICRO
        scaled = loss * LOSS_FACTOR * (static or 1.0)
        (scaler.scale(scaled) if scaler else scaled).backward()
        if static is not None or accum is not None:  # this micro-batch's gradient, unscaled, into buffers
            buf = accum or (torch.float64 if emulated else torch.float32)
            g = [(p.grad.to(torch.promote_types(p.grad.dtype, torch.float32)) / (static or 1.0)).to(buf)
                 if p.grad is not None else torch.zeros_like(p, dtype=buf) for p in params]
            acc = g if acc is None else [a + b for a, b in zip(acc, g)]
            for p in params:
                p.grad = None
    for p, a in zip(params, acc or []):
        p.grad = a.to(p.dtype)
    largest = max((float(p.grad.abs().max()) for p in params if p.grad is not None and p.grad.numel()), default=0.0)
    if CLIP is not None:  # unscaled first, then clipped
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, CLIP)
    (scaler.step(opt) if scaler else opt.step())
    after = flat(params)
    return before, after.float().double() if emulated else after, largest  # emulated: fp32 master weights


def correctly_rounded(t, largest):  # fp16: the largest power-of-two loss scale leaving FP16_HEADROOM
    scale = None
    if LOW == torch.float16:
        top = torch.finfo(LOW).max / FP16_HEADROOM / largest if largest > 0 else 2.0**16
        scale = 2.0 ** math.floor(math.log2(top))
    for _ in range(MAX_BACKOFF):  # halved while the step overflows
        before, after, _ = step(t, "emulated", scale)
        if bool(torch.isfinite(after).all()):
            return after - before
        if scale is None:
            return None
        scale /= 2
    return None


def relative_error(d, exact):
    norm, diff = float(exact.norm()), float((d - exact).norm())
    if not math.isfinite(diff):
        return math.inf
    return diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)


def ratio_of(a, b):  # a / b, with 0 / 0 = 0 and a / 0 = inf
    return a / b if b > 0 else (0.0 if a == 0 else math.inf)


ERRORS = {}  # step -> (the AMP step's error, the correctly rounded step's error), both against float64
for t in STATES:
    b64, a64, largest = step(t, "float64")
    emulated = correctly_rounded(t, largest)
    before, after, _ = step(t, "amp")
    if emulated is None or not bool(torch.isfinite(a64).all()) or (SCALER and bool((after == before).all())):
        print(f"step {t + 1}: left out (no finite correctly rounded step, or the scaler skipped it)")
        continue
    ERRORS[t] = (relative_error(after - before, a64 - b64), relative_error(emulated, a64 - b64))
    e_amp, e_emu = ERRORS[t]
    print(f"step {t + 1}: AMP step error {e_amp:.3g}, correctly rounded {e_emu:.3g} (x{ratio_of(e_amp, e_emu):.3g})")
ratios = sorted(ratio_of(a, e) for a, e in ERRORS.values())
n = len(ratios)
measured = (ratios[(n - 1) // 2] + ratios[n // 2]) / 2 if n else math.inf  # the median ratio over the steps
allowed = LANE_FACTOR"""


def _state_keys(optimizer: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """An optimizer state_dict's keys per parameter, each None (a tensor, saved beside the script)
    or its literal value: the script's ``OPT_KEYS``."""
    return {
        i: {k: None if isinstance(v, torch.Tensor) else v for k, v in entry.items()}
        for i, entry in optimizer["state"].items()
    }


def lane_repro_of(
    setup: Setup, recipe: Recipe, run: Run, steps: list[int], device: torch.device
) -> FailureRepro | None:
    """The AMP lane from the states ``run`` kept at ``steps`` (the checkpoints the lane judged): each
    state saved beside the script, the next step taken by the recipe, in float64 and correctly
    rounded in float64, the median ratio of their errors against ``LANE_FACTOR`` (None: see
    :func:`unsupported`, or a model whose source cannot be read, or batches that are not two tensors)."""

    dtype = lane_dtype(recipe)
    source = model_source(setup)
    if dtype is None or unsupported(setup, recipe) is not None or source is None or not steps:
        return None
    optimizer = type(setup.make_optimizer(list(setup.model(INIT_SEED).parameters()), setup.lr))
    if getattr(torch.optim, optimizer.__name__, None) is not optimizer:
        return None
    tensors: dict[str, torch.Tensor] = {}
    first = run.states[steps[0]]
    names, groups = list(first.model), first.optimizer["param_groups"]
    keys = _state_keys(first.optimizer)
    for t in steps:
        state = run.states[t]
        batch = state.next_batch
        two_tensors = isinstance(batch, tuple | list) and len(batch) == 2
        if not (two_tensors and all(isinstance(b, torch.Tensor) for b in batch)):
            return None
        same_shape = _state_keys(state.optimizer) == keys
        if list(state.model) != names or state.optimizer["param_groups"] != groups or not same_shape:
            return None  # a state of another shape (a schedule, a late-created moment): not written out
        tensors.update({f"m{t}_{i}": state.model[k] for i, k in enumerate(names)})
        for i, entry in state.optimizer["state"].items():
            tensors.update({f"o{t}_{i}_{k}": v for k, v in entry.items() if isinstance(v, torch.Tensor)})
        tensors[f"x{t}"], tensors[f"y{t}"] = batch[0], batch[1]
    low = str(dtype).removeprefix("torch.")
    accum = None if recipe.grad_accum_dtype is None else f"torch.{str(recipe.grad_accum_dtype).removeprefix('torch.')}"
    code = f"""from torch import nn
from torch.overrides import TorchFunctionMode

{source}
MODEL, INIT_SEED, OPTIMIZER = {setup.model.__name__}, {INIT_SEED}, torch.optim.{optimizer.__name__}
DEVICE, LOW, SCALER = {device.type!r}, torch.{low}, {recipe.scaler!r}  # the recipe: autocast dtype, GradScaler
MICRO, CLIP = {recipe.micro_batches}, {recipe.clip!r}  # micro-batches per step, clip_grad_norm_'s max norm
# loss x LOSS_FACTOR in every step; the recipe's own: loss x STATIC (a static loss scale), each
# micro-batch's gradient divided by it into a buffer of dtype ACCUM (float32 where only STATIC is set)
LOSS_FACTOR, STATIC, ACCUM = {recipe.loss_factor!r}, {recipe.static_scale!r}, {accum}
# the run's state after each judged step t, saved as m<t>_<i> (the model's NAMES[i]), o<t>_<p>_<key>
# (the optimizer's state of parameter p where OPT_KEYS marks None), x<t>, y<t> (the next batch)
NAMES = {names!r}
OPT_KEYS = {keys!r}
SCALES = {{{", ".join(f"{t}: {run.states[t].scale!r}" for t in steps)}}}  # the loss scale at each state
GROUPS = {groups!r}  # the optimizer's hyperparameters


def state(t):  # weights, optimizer state, next batch, loss scale
    g = globals()
    weights = {{k: g[f"m{{t}}_{{i}}"] for i, k in enumerate(NAMES)}}
    opt = {{i: {{k: g[f"o{{t}}_{{i}}_{{k}}"] if v is None else v for k, v in ks.items()}} for i, ks in OPT_KEYS.items()}}
    return weights, opt, (g[f"x{{t}}"], g[f"y{{t}}"]), SCALES[t]


STATES = {{t: state(t) for t in SCALES}}
# an AMP step may be at most LANE_FACTOR times less accurate than the same step correctly rounded
# to its format: the error of one significand bit fewer (first-order rounding analysis: error ~ u)
LANE_FACTOR = {LANE_FACTOR!r}
FP16_HEADROOM, MAX_BACKOFF = {FP16_HEADROOM!r}, {MAX_BACKOFF!r}  # the correctly rounded fp16 step's loss scale{_LANE_STEP}"""
    return FailureRepro(
        "training",
        f"{setup.name} under {recipe.name}: the next training step from each judged state of the run, its error "
        f"against the float64 step over that of the step correctly rounded to {low} (median over {len(steps)} states)",
        code,
        f"LANE_FACTOR = {LANE_FACTOR:g}: the error of a correctly rounded step is proportional to the format's unit "
        "roundoff, so 2 is that of one significand bit fewer",
        tensors,
        device=str(device),
    )


def census_skip_repro_of(setup: Setup, scale: float, seed: int, device: torch.device) -> FailureRepro | None:
    """The gradient census's scaler claim: from the census's state (saved beside the script), the
    fp32 gradients scaled by ``scale`` overflow fp16, so torch's GradScaler at ``scale`` must skip
    the step and back off (None: see :func:`unsupported`, or a source that cannot be read)."""

    at = census_state(setup, seed, device=device)  # the state the check stepped from
    prelude = model_prelude(setup, at.model.state_dict(), (at.inputs, at.targets), device)
    if prelude is None:
        return None
    opening, tensors = prelude
    code = f"""{opening}
# the census's state: WEIGHTS, the model after its fp32 warm-up steps, and (x, y) the next step's batch
LR = {setup.lr!r}
SCALE = {scale!r}  # the smallest loss scale 2^k at which the census found fp32 gradients beyond fp16's range
FP16_MAX = 65504.0  # (2 - 2^-10) x 2^15: fp16's largest finite value, from its bit layout

# reference: the fp32 gradients of this step, times SCALE, leave fp16's range
model = model_at()
loss_of(model, None).backward()
largest = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
predicted = largest * SCALE > FP16_MAX
print(f"largest fp32 gradient {{largest:.4g}} x {{SCALE:g}} = {{largest * SCALE:.4g}} (fp16 max {{FP16_MAX:g}}): "
      f"{{'overflow' if predicted else 'no overflow'}} predicted")
# under test: torch's GradScaler at SCALE must skip this step (no parameter moves) and back off
model = model_at()
params = [p for p in model.parameters() if p.requires_grad]
before = [p.detach().clone() for p in params]
opt = torch.optim.SGD(params, lr=LR)
scaler = torch.amp.GradScaler(DEVICE, init_scale=SCALE)
scaler.scale(loss_of(model, torch.float16)).backward()
scaler.step(opt)
scaler.update()
moved = sum(not torch.equal(p.detach(), b) for p, b in zip(params, before))
print(f"GradScaler at {{SCALE:g}}: {{moved}} of {{len(params)}} parameters moved, scale after the step {{scaler.get_scale():g}}")
measured = int(predicted and (moved > 0 or not scaler.get_scale() < SCALE))  # 1: overflow predicted, no skip
allowed = 0"""
    return FailureRepro(
        "training",
        f"{setup.name}: one fp16-autocast step with torch's GradScaler at {scale:g}, where the fp32 gradients times "
        "the scale overflow fp16: the step skipped and the scale backed off",
        code,
        "exact: an overflow in the scaled gradients skips the step and backs the scale off (GradScaler's rule)",
        tensors,
        device=str(device),
    )


def op_local_error(
    what: str,
    call: str,
    tensors: Mapping[str, torch.Tensor],
    unit_dtype: torch.dtype,
    budget_u: float,
    origin: str,
    *,
    device: str = "cpu",
    cast: bool = False,
) -> FailureRepro:
    """One aten op of a training step, on the inputs it saw, against itself in float64: its local
    error ``max |out - ref| / max |ref|`` in units of ``unit_dtype``'s unit roundoff (the op's
    output format, or the recipe's where the output's is narrower). ``cast``: a cast, whose exact
    result is its input (``t0``)."""
    u = format_of(unit_dtype).unit_roundoff
    reference = (
        "# reference: a cast's exact result is its input\nref = t0.double()"
        if cast
        else f"""# reference: the same op on the same inputs upcast exactly to float64
{upcast_src(tensors)}
ref = {call}
ref = ref[0] if isinstance(ref, (tuple, list)) else ref"""
    )
    code = f"""got = {call}
got = got[0] if isinstance(got, (tuple, list)) else got  # an op with several outputs: the first
{reference}
U = {u!r}  # unit roundoff of {str(unit_dtype).removeprefix("torch.")}
measured = float((got.double() - ref).abs().max() / ref.abs().max()) / U  # the op's own error, in u
allowed = {budget_u!r}"""
    return FailureRepro("op", what, code, origin, dict(tensors), device=device)


def op_repro_of(o: OpPrint | None, device: torch.device | str = "cpu") -> FailureRepro | None:
    """The standalone reproduction of an op over its budget (None: no op, or its call was not kept):
    the op alone on the inputs it saw, against itself in float64."""
    if o is None or o.call is None:
        return None

    unit = o.unit or o.dtype
    return op_local_error(
        f"{o.describe()}: its own error against float64 on the inputs it saw, in u of {unit}",
        o.call.source,
        o.call.tensors,
        getattr(torch, unit),
        o.budget_u,
        "CAST_BUDGET_U: one rounding to nearest errs by less than 1 u"
        if o.cast
        else "OP_BUDGET_U: 1 u for rounding the output once, plus what kernels keeping low-precision intermediates "
        "add (measured clean at most 3.8 u on the harness's models: about twice that)",
        device=str(device),
        cast=o.cast,
    )
