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
Your own models, emulated recipes (the harness's float64 rounding mode), setups with a
schedule, an optimizer factory or a scaler of their own, and compile backend functions keep no
script: the script would need code it cannot carry.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from harness.domains.training.loop import DATA_SEED_OFFSET, EVAL_SEED, INIT_SEED
from harness.domains.training.parity import PARITY_FRACTION, Band
from harness.domains.training.recipes import Recipe, Setup

if TYPE_CHECKING:
    from harness.domains.failure_repro import FailureRepro


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
    from harness.domains.failure_repro import FailureRepro

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
    from harness.domains.failure_repro import FailureRepro

    trainer = _trainer(setup, recipe, device, None, frozenset(), [])
    if trainer is None:
        return None
    prelude, tensors = trainer
    dtype = "None" if recipe.dtype is None else f"torch.{str(recipe.dtype).removeprefix('torch.')}"
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
    model_src, loss_src = _sources(setup.model), _loss_source(setup.loss) if setup.loss else None
    orders = []
    for seed in range(seeds):
        gen = torch.Generator().manual_seed(DATA_SEED_OFFSET + seed)
        orders.append([setup.batch(step, gen) for step in range(setup.steps)])
    eval_batch = setup.batch(0, torch.Generator().manual_seed(EVAL_SEED))
    if model_src is None or loss_src is None:
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

{model_src}


{loss_src}
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
    from harness.domains.failure_repro import FailureRepro

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
