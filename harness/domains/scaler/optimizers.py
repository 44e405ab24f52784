"""GradScaler driving every optimizer implementation: for-loop, foreach and fused.

The paths users run are not the textbook one: CUDA's default optimizer implementation is foreach,
and a fused optimizer (``_step_supports_amp_scaling``) receives GradScaler's ``grad_scale`` and
``found_inf`` and unscales and skips inside its own kernel. Each implementation of SGD (momentum),
Adam, AdamW and Adagrad is stepped by GradScaler on a small fp16-autocast model, with one
non-finite gradient element planted at chosen steps, and every step is checked:

* a step without overflow against the optimizer's update computed here in float64 from the same
  parameters, state and unscaled gradients (the harness's own arithmetic, never torch's optimizer),
  within a budget of the update's roundings (:func:`reference_step`);
* a step with overflow: parameters, optimizer state and step counts bitwise as they were, and the
  scale backed off.

Pure low-precision training (the parameters themselves in bf16 or fp16, as many fine-tuning
recipes run) takes other kernels: every implementation steps such parameters too
(:func:`run_low_precision`), against the same float64 update within the roundings of the
parameters' own format. torch 2.13's fused CPU SGD left whole vector blocks of bf16 and fp16
parameters unchanged, and a check of fp32 parameters alone passed it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.domains.engines.state import differences, state_of
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import BF16, FP16, FP32, FloatFormat
from harness.numerics.tolerance import gamma
from harness.platform.kernels import first_line

IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
OPTIMIZERS = ("SGD", "Adam", "AdamW", "Adagrad")

#: Hyperparameters: weight decay on, so its path is exercised; momentum for SGD.
HYPER: dict[str, dict[str, Any]] = {
    "SGD": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01},
    "Adam": {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "AdamW": {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01},
    "Adagrad": {"lr": 0.05, "eps": 1e-10, "weight_decay": 0.01, "lr_decay": 0.0},
}

#: Roundings on the path from (p, state, g) to the new parameter, counted on torch's for-loop
#: formulas (foreach and fused evaluate the same formulas, some with fewer roundings):
#: SGD: g + wd p (2), momentum buffer m b + g (2), lr b (1), p - (1);
#: Adam/AdamW: decay g + wd p or p (1 - lr wd) (2), exp_avg lerp (3), exp_avg_sq b2 v + (1-b2) g g
#: (4), sqrt, / sqrt(bc2), + eps (3), lr / bc1 (1), m / denom, x step, p - (3);
#: Adagrad: g + wd p (2), sum + g g (2), sqrt, + eps (2), lr / (1 + ...) (1), g / std, x clr, p - (3).
ROUNDINGS = {"SGD": 6, "Adam": 16, "AdamW": 16, "Adagrad": 10}
#: Of those, the roundings at the parameter's own magnitude (the rest are at the update's): the
#: final ``p - update`` and AdamW's decay ``p (1 - lr wd)``. The budget charges these to ``|p|`` and
#: the others to the update's magnitude, so that a step whose update is far below ``|p|``, as in
#: bf16 (unit roundoff 2^-8, a parameter of 0.5 and an Adam update of 0.01), is still bounded
#: tighter than the update itself: a step that changed nothing exceeds it.
PARAM_ROUNDINGS = 2
#: Roundings of each state tensor's update: momentum buffer (g + wd p, b m + g), exp_avg
#: (decay, lerp), exp_avg_sq (decay, square, scale, add), Adagrad's sum (decay, square, add).
STATE_ROUNDINGS = {"momentum_buffer": 4, "exp_avg": 5, "exp_avg_sq": 6, "sum": 4}

#: Steps of a run, the growth interval (so the scale grows within a run) and where a non-finite
#: gradient element is planted: step -> (parameter index, flat element index, value). The first
#: step (state not yet created), one mid-run, one just after growth; +inf, NaN and -inf.
STEPS = 8
GROWTH_INTERVAL = 2
OVERFLOWS: dict[int, tuple[int, int, float]] = {0: (0, 3, math.inf), 3: (2, 5, math.nan), 6: (1, 0, -math.inf)}


#: torch.optim's keyword choosing each implementation
FLAGS: dict[str, dict[str, bool]] = {
    "for-loop": {"foreach": False},
    "foreach": {"foreach": True},
    "fused": {"fused": True},
}


def make(name: str, implementation: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """``name`` (torch.optim) in ``implementation``, with :data:`HYPER`."""
    optimizer: torch.optim.Optimizer = getattr(torch.optim, name)(params, **HYPER[name], **FLAGS[implementation])
    return optimizer


def missing(name: str, implementation: str, device: torch.device, dtype: str = "float32") -> str | None:
    """Why this stack has no ``implementation`` of ``name`` for ``dtype`` parameters on ``device``, or None."""
    p = torch.nn.Parameter(torch.ones(4, device=device, dtype=getattr(torch, dtype)))
    try:
        opt = make(name, implementation, [p])
        p.grad = torch.ones_like(p)
        opt.step()
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        of = "" if dtype == "float32" else f" for {dtype} parameters"
        return f"torch {torch.__version__} has no {implementation} {name}{of} on {device.type}: {first_line(e)}"
    return None


@dataclass
class Step:
    """What one scaler step saw and did: the tensors before and after, the scale, whether a
    non-finite element was planted, and the optimizer's state keyed by parameter index."""

    index: int
    overflow: bool
    scale_before: float
    scale_after: float
    params_before: list[torch.Tensor]
    params_after: list[torch.Tensor]
    grads_unscaled: list[torch.Tensor]
    state_before: dict[int, dict[str, torch.Tensor]]
    state_after: dict[int, dict[str, torch.Tensor]]
    #: the gradients as GradScaler's step received them: scaled, the planted element included
    grads_scaled: list[torch.Tensor] = field(default_factory=list)


@dataclass
class Run:
    name: str
    implementation: str
    steps: list[Step] = field(default_factory=list)


def small_model(device: torch.device) -> torch.nn.Module:
    """The two-layer regression model (seed 0) the scaler-and-optimizer checks step."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)


Factory = Callable[[str, str, list[torch.nn.Parameter]], torch.optim.Optimizer]


def run(
    name: str,
    implementation: str,
    device: torch.device,
    overflows: Mapping[int, tuple[int, int, float]] = OVERFLOWS,
    factory: Factory = make,
    scaler_cls: type[torch.amp.GradScaler] = torch.amp.GradScaler,
) -> Run:
    """Train a two-layer regression model under fp16 autocast with GradScaler and the optimizer
    ``factory`` makes, planting the non-finite gradient elements of ``overflows``."""
    model = small_model(device)
    params = list(model.parameters())
    opt = factory(name, implementation, params)
    scaler = scaler_cls(device.type, init_scale=2.0**10, growth_interval=GROWTH_INTERVAL)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(32, 8, generator=g).to(device), torch.randn(32, 1, generator=g).to(device)
    out = Run(name, implementation)
    for t in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        planted = overflows.get(t)
        if planted is not None:
            index, element, value = planted
            grad = params[index].grad
            assert grad is not None
            grad.view(-1)[element] = value
        scale = float(scaler.get_scale())
        before = [p.detach().clone() for p in params]
        scaled = [p.grad.detach().clone() for p in params if p.grad is not None]
        grads = [g.to(torch.float64) / scale for g in scaled]
        state_before = state_of(opt, params)
        scaler.step(opt)
        scaler.update()
        out.steps.append(
            Step(
                t,
                planted is not None,
                scale,
                float(scaler.get_scale()),
                before,
                [p.detach().clone() for p in params],
                grads,
                state_before,
                state_of(opt, params),
                scaled,
            )
        )
    return out


@dataclass(frozen=True)
class Expected:
    """The float64 reference of one parameter's step: new values and their rounding budgets, for
    the parameter and each state tensor."""

    param: torch.Tensor
    param_budget: torch.Tensor
    state: dict[str, torch.Tensor]
    state_budget: dict[str, torch.Tensor]


def reference_step(
    name: str, p: torch.Tensor, g: torch.Tensor, state: Mapping[str, torch.Tensor], fmt: FloatFormat = FP32
) -> Expected:
    """One step of ``name`` (torch's documented update, :data:`HYPER`) in float64 from the
    parameter ``p``, unscaled gradient ``g`` and state before the step. The budgets are the running
    error bound in ``fmt`` (the parameters' format, which the state shares): gamma_k of ``fmt``'s
    unit roundoff (k the roundings of :data:`ROUNDINGS`) times the update evaluated on magnitudes,
    plus gamma_PARAM_ROUNDINGS times ``|p|`` for the roundings at the parameter's magnitude."""
    h, u = HYPER[name], fmt.unit_roundoff
    # on the CPU, whatever the device under test (optimizers keep their step counts on the CPU)
    p, g = p.to(torch.float64).cpu(), g.to(torch.float64).cpu()
    prev = {k: v.to(torch.float64).cpu() for k, v in state.items()}
    wd = float(h.get("weight_decay", 0.0))
    if name == "SGD":
        d = g + wd * p
        d_abs = g.abs() + wd * p.abs()
        buf = prev.get("momentum_buffer")
        if buf is None:
            b, b_abs = d, d_abs
        else:
            b, b_abs = h["momentum"] * buf + d, h["momentum"] * buf.abs() + d_abs
        new = p - h["lr"] * b
        return Expected(
            new,
            _budget(name, u, p, h["lr"] * b_abs),
            {"momentum_buffer": b},
            {"momentum_buffer": gamma(STATE_ROUNDINGS["momentum_buffer"], u) * b_abs},
        )
    if name in ("Adam", "AdamW"):
        b1, b2 = h["betas"]
        step = float(prev["step"]) + 1 if "step" in prev else 1.0
        decayed = p * (1 - h["lr"] * wd) if name == "AdamW" else p
        gd = g if name == "AdamW" else g + wd * p
        gd_abs = g.abs() if name == "AdamW" else g.abs() + wd * p.abs()
        m0 = prev.get("exp_avg", torch.zeros_like(p))
        v0 = prev.get("exp_avg_sq", torch.zeros_like(p))
        m = b1 * m0 + (1 - b1) * gd
        m_abs = 2 * m0.abs() + gd_abs  # torch's lerp: m0 + w (g - m0), three roundings on these
        v = b2 * v0 + (1 - b2) * gd * gd
        v_abs = b2 * v0 + (1 - b2) * gd_abs * gd_abs
        denom = v.sqrt() / math.sqrt(1 - b2**step) + h["eps"]
        step_size = h["lr"] / (1 - b1**step)
        new = decayed - step_size * m / denom
        return Expected(
            new,
            _budget(name, u, p, step_size * m_abs / denom),
            {"exp_avg": m, "exp_avg_sq": v, "step": torch.tensor(step, dtype=torch.float64)},
            {
                "exp_avg": gamma(STATE_ROUNDINGS["exp_avg"], u) * m_abs,
                "exp_avg_sq": gamma(STATE_ROUNDINGS["exp_avg_sq"], u) * v_abs,
                "step": torch.tensor(0.0, dtype=torch.float64),
            },
        )
    if name == "Adagrad":
        step = float(prev["step"]) + 1 if "step" in prev else 1.0
        gd = g + wd * p
        gd_abs = g.abs() + wd * p.abs()
        s = prev["sum"] + gd * gd
        s_abs = prev["sum"] + gd_abs * gd_abs
        clr = h["lr"] / (1 + (step - 1) * h["lr_decay"])
        std = s.sqrt() + h["eps"]
        new = p - clr * gd / std
        return Expected(
            new,
            _budget(name, u, p, clr * gd_abs / std),
            {"sum": s, "step": torch.tensor(step, dtype=torch.float64)},
            {"sum": gamma(STATE_ROUNDINGS["sum"], u) * s_abs, "step": torch.tensor(0.0, dtype=torch.float64)},
        )
    raise ValueError(f"no float64 reference for optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


def _budget(name: str, u: float, p: torch.Tensor, update_abs: torch.Tensor) -> torch.Tensor:
    """The new parameter's error bound: PARAM_ROUNDINGS roundings at ``|p|``, and all of the
    update's roundings at the update evaluated on magnitudes (the final rounding touches both)."""
    return gamma(PARAM_ROUNDINGS, u) * p.abs() + gamma(ROUNDINGS[name], u) * update_abs


@dataclass(frozen=True)
class AgainstFloat64:
    """Every non-overflow step of a run beside its float64 reference, flattened (parameters, then
    each state tensor, step by step) with an error budget per element; the first step over its
    budget (its script reproduces it), None when every step kept within."""

    actual: torch.Tensor
    expected: torch.Tensor
    budget: torch.Tensor
    first_over: Step | None


def against_float64(name: str, run: Run, fmt: FloatFormat = FP32) -> AgainstFloat64:
    """Each step of ``run`` that took no overflow, against :func:`reference_step` from the same
    parameters, state and unscaled gradients in ``fmt``'s roundings. A state tensor the reference
    has and the step did not keep counts as NaN (never within a budget)."""
    actual: list[torch.Tensor] = []
    expected: list[torch.Tensor] = []
    budget: list[torch.Tensor] = []
    first_over: Step | None = None
    for step in run.steps:
        if step.overflow:
            continue
        start = len(actual)
        for i, (before, after, grad) in enumerate(
            zip(step.params_before, step.params_after, step.grads_unscaled, strict=True)
        ):
            ref = reference_step(name, before, grad, step.state_before.get(i, {}), fmt)
            actual.append(after.flatten().cpu().double())
            expected.append(ref.param.flatten())
            budget.append(ref.param_budget.flatten())
            for key, value in ref.state.items():
                got = step.state_after.get(i, {}).get(key)
                if got is None:
                    got = torch.full_like(value, float("nan"))
                actual.append(got.flatten().cpu().double())
                expected.append(value.flatten())
                budget.append(ref.state_budget[key].expand_as(value).flatten())
        errors = (torch.cat(actual[start:]) - torch.cat(expected[start:])).abs()
        if first_over is None and not bool((errors <= torch.cat(budget[start:])).all()):
            first_over = step
    return AgainstFloat64(torch.cat(actual), torch.cat(expected), torch.cat(budget), first_over)


#: The parameter formats of pure low-precision training, each with whether GradScaler steps it.
#: GradScaler refuses to unscale fp16 gradients ("Attempting to unscale FP16 gradients"), so fp16
#: parameters step alone; bf16 ones both ways (a fused optimizer then receives ``grad_scale``).
LOW_PRECISION: tuple[tuple[FloatFormat, bool], ...] = ((BF16, True), (BF16, False), (FP16, False))

#: Shapes of the low-precision parameters: 131 elements (whole vector blocks of every SIMD width a
#: CPU kernel uses, 8 to 64 lanes, and a remainder), 16 x 8 (whole blocks only), 7 (a remainder
#: only) and 1. torch 2.13's fused CPU SGD skipped exactly the whole blocks.
LOW_PRECISION_SHAPES: tuple[tuple[int, ...], ...] = ((131,), (16, 8), (7,), (1,))

#: Magnitudes of the synthetic parameters and gradients, each drawn uniformly with a random sign.
#: Gradients of at least 0.5 keep every intermediate of every update a normal number of fp16:
#: Adam's (1 - beta2) g^2 >= 2.5e-4 beside fp16's smallest normal 6.1e-5, Adagrad's sum >= 0.25;
#: eps (1e-8, which fp16 rounds to zero) is then below 1e-7 of every denominator. Parameters of at
#: most 1 keep each update above the bf16 spacing of the parameter it changes.
PARAM_RANGE = (0.25, 1.0)
GRAD_RANGE = (0.5, 2.0)


def _signed_uniform(shape: tuple[int, ...], lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    magnitude = lo + (hi - lo) * torch.rand(shape, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(shape, generator=g, dtype=torch.float64) < 0.5, -1.0, 1.0)
    return magnitude * sign


def _synthetic_step(
    index: int,
    params: list[torch.nn.Parameter],
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    gen: torch.Generator,
    plant: tuple[int, float] | None = None,
) -> Step:
    """One step of ``params`` on the loss ``sum(p * g)`` (in float32, so that parameters of several
    dtypes share it), ``g`` drawn afresh (seeded) within GRAD_RANGE in each parameter's dtype, so
    that each gradient is ``g`` exactly (times a power of two where ``scaler`` steps it); ``plant``:
    (parameter index, value) written into that parameter's first gradient element before the step."""
    targets = [_signed_uniform(tuple(p.shape), *GRAD_RANGE, gen).to(p.dtype).to(p.device) for p in params]
    opt.zero_grad(set_to_none=True)
    loss = torch.stack([(p * g).float().sum() for p, g in zip(params, targets, strict=True)]).sum()
    scale = float(scaler.get_scale()) if scaler is not None else 1.0
    (scaler.scale(loss) if scaler is not None else loss).backward()  # type: ignore[no-untyped-call]
    if plant is not None:
        grad = params[plant[0]].grad
        assert grad is not None
        grad.view(-1)[0] = plant[1]
    before = [p.detach().clone() for p in params]
    scaled_grads = [p.grad.detach().clone() for p in params if p.grad is not None]
    state_before = state_of(opt, params)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return Step(
        index,
        plant is not None,
        scale,
        float(scaler.get_scale()) if scaler is not None else 1.0,
        before,
        [p.detach().clone() for p in params],
        [g.to(torch.float64) / scale for g in scaled_grads],
        state_before,
        state_of(opt, params),
        scaled_grads,
    )


def _synthetic_params(
    dtypes: Sequence[torch.dtype], device: torch.device, gen: torch.Generator
) -> list[torch.nn.Parameter]:
    """Parameters of :data:`LOW_PRECISION_SHAPES` in ``dtypes`` (one per shape), drawn within PARAM_RANGE."""
    return [
        torch.nn.Parameter(_signed_uniform(shape, *PARAM_RANGE, gen).to(dtype).to(device))
        for shape, dtype in zip(LOW_PRECISION_SHAPES, dtypes, strict=True)
    ]


def run_low_precision(
    name: str,
    implementation: str,
    device: torch.device,
    fmt: FloatFormat,
    scaled: bool,
    factory: Factory = make,
) -> Run:
    """Step parameters held in ``fmt`` (:data:`LOW_PRECISION_SHAPES`) STEPS times with the
    optimizer ``factory`` makes (:func:`_synthetic_step`; GradScaler steps it where ``scaled``)."""
    gen = torch.Generator().manual_seed(2)
    params = _synthetic_params([getattr(torch, fmt.name)] * len(LOW_PRECISION_SHAPES), device, gen)
    opt = factory(name, implementation, params)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=GROWTH_INTERVAL) if scaled else None
    return Run(name, implementation, [_synthetic_step(t, params, opt, scaler, gen) for t in range(STEPS)])


def changed(step: Step) -> list[str]:
    """What an overflow step changed that it must not have (:func:`differences`)."""
    return differences(step.params_before, step.params_after, step.state_before, step.state_after)


#: The parameter formats of one optimizer holding fp32 and bf16 parameters together (a model whose
#: embeddings or norms someone kept in another dtype): GradScaler unscales and checks their
#: gradients group by group, one (device, dtype) group at a time.
MIXED_DTYPES: tuple[FloatFormat, ...] = (FP32, BF16)


def run_mixed_overflow(
    name: str, implementation: str, device: torch.device, inf_in: FloatFormat, factory: Factory = make
) -> Step:
    """One optimizer over parameters of :data:`LOW_PRECISION_SHAPES` whose dtypes alternate over
    :data:`MIXED_DTYPES`, stepped by GradScaler: a clean step (so that the state exists), then a
    step whose gradients carry one non-finite element in the ``inf_in`` parameters only. Returns
    that second step: GradScaler must find the element whichever group it is in and skip the whole
    step (a finite group checked after it must not clear what an earlier one found)."""
    gen = torch.Generator().manual_seed(3)
    dtypes = [getattr(torch, MIXED_DTYPES[i % len(MIXED_DTYPES)].name) for i in range(len(LOW_PRECISION_SHAPES))]
    params = _synthetic_params(dtypes, device, gen)
    opt = factory(name, implementation, params)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=GROWTH_INTERVAL)
    _synthetic_step(0, params, opt, scaler, gen)
    return _synthetic_step(1, params, opt, scaler, gen, plant=(dtypes.index(getattr(torch, inf_in.name)), math.inf))


def mixed_overflow_claim(name: str, impl: str, inf_in: FloatFormat, step: Step) -> ClaimComparison:
    """The step with a non-finite element in one dtype's gradients: nothing changed (parameters of
    every dtype, state, step counts, bitwise) and the scale halved."""
    touched = changed(step)
    halved = step.scale_after == step.scale_before * 0.5
    problems = touched + ([] if halved else [f"the scale {step.scale_after:g}, not {step.scale_before * 0.5:g}"])
    return compare_claim(
        f"{name}.{impl}.mixed_{inf_in.short}_inf_untouched",
        len(problems),
        not problems,
        f"an optimizer over fp32 and bf16 parameters: a non-finite element in the {inf_in.name} gradients only "
        "skips the whole step (every dtype's parameters, state and step counts bitwise unchanged), scale x 0.5",
        detail="changed: " + ", ".join(problems) if problems else "nothing changed, the scale halved",
        expected=0,
        allowance=0,
    )


FUSED_SGD_FIRST_STEP = "fused-sgd-first-step-overflow-keeps-uninitialised-momentum"


def first_step_overflow_uses_uninitialised_momentum(
    device: torch.device, scaler_cls: type[torch.amp.GradScaler] = torch.amp.GradScaler
) -> bool:
    """Whether fused SGD (momentum), whose first step GradScaler skips for an overflow, treats the
    momentum buffer it allocated with ``empty_like`` as initialised at the next step. Deterministic:
    the buffer left by the skipped step is filled with NaN (what uninitialised memory may hold);
    the next step's parameters are NaN exactly when the kernel read it instead of starting it."""
    p = torch.nn.Parameter(torch.ones(4, device=device))
    sgd = make("SGD", "fused", [p])
    scaler = scaler_cls(device.type, init_scale=2.0**10)
    for t in range(2):
        sgd.zero_grad(set_to_none=True)
        scaler.scale((p * 2).sum()).backward()  # type: ignore[no-untyped-call]
        if t == 0:
            assert p.grad is not None
            p.grad.view(-1)[0] = math.inf
        scaler.step(sgd)
        scaler.update()
        if t == 0:
            buf = sgd.state.get(p, {}).get("momentum_buffer")
            if not isinstance(buf, torch.Tensor):
                return False  # no buffer kept: the next step starts it
            buf.fill_(math.nan)
    return bool(p.detach().isnan().any())


FUSED_SGD_LOW_PRECISION = "fused-sgd-cpu-skips-low-precision-vector-blocks"


def fused_sgd_skips_low_precision_vector_blocks(device: torch.device) -> bool:
    """Whether one step of fused SGD (no momentum, lr 0.1, a gradient of ones) leaves any element of
    a 131-element bf16 or fp16 parameter exactly as it was: the step changes every one (0.1 is
    above every spacing of values in [0.25, 1] in both formats), so an unchanged element is a
    skipped one. False where the stack has no fused SGD for the format."""
    for dtype in (torch.bfloat16, torch.float16):
        start = torch.linspace(0.25, 1.0, 131, dtype=torch.float64).to(dtype).to(device)
        p = torch.nn.Parameter(start.clone())
        try:
            sgd = torch.optim.SGD([p], lr=0.1, fused=True)
            p.grad = torch.ones_like(p)
            sgd.step()
        except (RuntimeError, ValueError, TypeError, NotImplementedError):
            continue
        if bool((p.detach() == start).any()):
            return True
    return False


# -- the claims: the overflow check's verdict, decided here ------------------------------------------
def planted_claim(name: str, impl: str, overflows: Sequence[Step]) -> ClaimComparison:
    """The precondition: at least one non-finite gradient element was planted."""
    return compare_claim(
        f"{name}.{impl}.overflow_steps_planted",
        len(overflows),
        bool(overflows),
        "at least one non-finite gradient element was planted (otherwise nothing was checked)",
        detail="no overflow planted: vacuous",
        inconclusive=True,
    )


@dataclass(frozen=True)
class Untouched:
    """The overflow claim, and the first overflow step that broke it (its script), if any."""

    claim: ClaimComparison
    first: Step | None


def untouched_claim(name: str, impl: str, overflows: Sequence[Step]) -> Untouched:
    """At every planted non-finite element: parameters, optimizer state and step counts bitwise
    unchanged (:func:`changed`), the scale halved."""
    touched = {s.index: changed(s) for s in overflows}
    touched = {t: what for t, what in touched.items() if what}
    not_backed_off = [s.index for s in overflows if s.scale_after != s.scale_before * 0.5]
    first = next((s for s in overflows if s.index in touched or s.index in not_backed_off), None)
    detail = "; ".join(
        [f"step {t} changed {', '.join(what)}" for t, what in sorted(touched.items())]
        + [f"step {t}: the scale did not halve" for t in not_backed_off]
    )
    claim = compare_claim(
        f"{name}.{impl}.overflow_untouched",
        len(touched) + len(not_backed_off),
        not touched and not not_backed_off,
        "at every planted non-finite gradient element (+inf, NaN, -inf; the first step, mid-run, after "
        "growth): parameters, optimizer state and step counts bitwise unchanged, scale x 0.5",
        detail=detail or f"{len(overflows)} overflow steps, none touched anything",
        expected=0,
        allowance=0,
    )
    return Untouched(claim, first)
