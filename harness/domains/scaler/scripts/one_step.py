"""One optimizer step under GradScaler, standalone, from the parameters, optimizer state and scaled
gradients a run had (the smallest faithful part of a training run): without overflow against the
update written out in float64, within gamma_k(2^-24) of it evaluated on magnitudes; with a planted
inf/NaN, nothing moved and the scale halved; and one ``unscale_`` -> ``clip_grad_norm_`` -> step
against clipping's definition in float64, a non-finite norm, or ``error_if_nonfinite``.

amp-harness keeps the blocks a failed check needs and writes the saved tensors' names and its
values over the defaults below (``harness.domains.scaler.repro``); as it lies here it judges one
step of torch's SGD with momentum on random parameters whose gradients are finite, so the
judgements of an overflow list what that step changed.
"""

import math
from typing import Any

import torch

# -- inputs --
_gen = torch.Generator().manual_seed(0)
p0, p1 = torch.randn(4, 3, generator=_gen), torch.randn(3, generator=_gen)
g0, g1 = torch.randn(4, 3, generator=_gen) * 1024.0, torch.randn(3, generator=_gen) * 1024.0

# -- parameters --
OPTIMIZER: Any = torch.optim.SGD  # the optimizer under GradScaler
H: dict[str, Any] = {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}  # its hyperparameters
FLAGS: dict[str, Any] = {"foreach": False}  # its implementation
P0 = [p0, p1]  # the parameters before the step
G = [g0, g1]  # their gradients, scaled, as GradScaler's step received them
STATE: list[dict[str, torch.Tensor]] = [{}, {}]  # the optimizer's state before the step ({}: none yet)
SCALE = 1024.0  # GradScaler's scale then (a power of two: unscaling is exact)
DEVICE = "cpu"

# -- loaded --
Loaded = tuple[list[torch.nn.Parameter], torch.optim.Optimizer, torch.amp.GradScaler]


def load() -> Loaded:
    """The parameters, the optimizer loaded with STATE, the scaled gradients G, a GradScaler at SCALE."""
    params = [torch.nn.Parameter(p.clone()) for p in P0]
    opt = OPTIMIZER(params, **H, **FLAGS)
    for p, st in zip(params, STATE, strict=True):
        if st:
            opt.state[p] = {k: v.clone() for k, v in st.items()}
    for p, g in zip(params, G, strict=True):
        p.grad = g.clone()
    scaler = torch.amp.GradScaler(DEVICE, init_scale=SCALE)
    scaler.scale(torch.zeros((), device=DEVICE))  # GradScaler creates its scale on first use
    return params, opt, scaler


def same(a: torch.Tensor, b: torch.Tensor) -> bool:  # bitwise, NaN equal to NaN
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def untouched(params: list[torch.nn.Parameter], opt: torch.optim.Optimizer) -> list[str]:
    """What a skipped step must leave as it was (parameters, optimizer state) and did not."""
    out = [f"parameter {i}" for i, (p, p0) in enumerate(zip(params, P0, strict=True)) if not same(p.detach(), p0)]
    for i, (p, st) in enumerate(zip(params, STATE, strict=True)):
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v) and (not same(v, st[k]) if k in st else bool((v != 0).any())):
                out.append(f"state {k} of parameter {i}")
    return out


# -- step --
params, opt, scaler = load()
scaler.step(opt)
scaler.update()

# -- step_alone --
# the optimizer alone (parameters in fp16, whose gradients GradScaler refuses to unscale; SCALE 1)
params, opt, scaler = load()
opt.step()

# -- overflow --
# reference: a step with a non-finite gradient is skipped (nothing moves) and the scale is halved
wrong = untouched(params, opt)
if scaler.get_scale() != SCALE * 0.5:
    wrong.append(f"the scale: {scaler.get_scale()!r} after the step, not {SCALE * 0.5!r}")
for w in wrong:
    print(f"the skipped step changed {w}")
measured: float = len(wrong)  # things the skipped step changed
allowed: float = 0

# -- gamma --
U = 2.0**-24  # the parameters' format's unit roundoff (float32's)


def gamma(k: int) -> float:  # the bound on k float32 roundings: k u / (1 - k u)
    return k * U / (1 - k * U)


# -- roundings --
K = 3  # roundings on the way to the parameter
K_STATE = {"momentum_buffer": 2}  # roundings on the way to each state entry
Reference = tuple[torch.Tensor, torch.Tensor, dict[str, tuple[torch.Tensor, torch.Tensor]]]

# -- adam --
DECOUPLED = True  # AdamW: the parameter decays; Adam: the gradient carries the decay (L2)


def reference(p: torch.Tensor, g: torch.Tensor, st: dict[str, torch.Tensor]) -> Reference:
    """Torch's Adam or AdamW in float64: the update, its budget, and each state entry's."""
    (b1, b2), lr, wd, eps = H["betas"], H["lr"], H["weight_decay"], H["eps"]
    step = float(st["step"]) + 1 if "step" in st else 1.0
    if DECOUPLED:
        decayed, gd, gd_abs = p * (1 - lr * wd), g, g.abs()
    else:
        decayed, gd, gd_abs = p, g + wd * p, g.abs() + wd * p.abs()
    m0, v0 = st.get("exp_avg", torch.zeros_like(p)), st.get("exp_avg_sq", torch.zeros_like(p))
    m, m_abs = b1 * m0 + (1 - b1) * gd, 2 * m0.abs() + gd_abs  # torch's lerp: m0 + w (g - m0)
    v, v_abs = b2 * v0 + (1 - b2) * gd * gd, b2 * v0 + (1 - b2) * gd_abs * gd_abs
    denom = v.sqrt() / math.sqrt(1 - b2**step) + eps
    size = lr / (1 - b1**step)
    new, mag = decayed - size * m / denom, p.abs() + size * m_abs / denom
    exact = (torch.tensor(step, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))  # counts: exact
    return (
        new,
        gamma(K) * mag,
        {
            "exp_avg": (m, gamma(K_STATE["exp_avg"]) * m_abs),
            "exp_avg_sq": (v, gamma(K_STATE["exp_avg_sq"]) * v_abs),
            "step": exact,
        },
    )


# -- adagrad --


def reference(p: torch.Tensor, g: torch.Tensor, st: dict[str, torch.Tensor]) -> Reference:  # type: ignore[no-redef]  # noqa: F811
    """Torch's Adagrad (weight decay, lr decay) in float64."""
    step = float(st["step"]) + 1
    gd, gd_abs = g + H["weight_decay"] * p, g.abs() + H["weight_decay"] * p.abs()
    s, s_abs = st["sum"] + gd * gd, st["sum"] + gd_abs * gd_abs
    clr = H["lr"] / (1 + (step - 1) * H["lr_decay"])
    std = s.sqrt() + H["eps"]
    new, mag = p - clr * gd / std, p.abs() + clr * gd_abs / std
    exact = (torch.tensor(step, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))  # counts: exact
    return new, gamma(K) * mag, {"sum": (s, gamma(K_STATE["sum"]) * s_abs), "step": exact}


# -- sgd --


def reference(p: torch.Tensor, g: torch.Tensor, st: dict[str, torch.Tensor]) -> Reference:  # type: ignore[no-redef]  # noqa: F811
    """Torch's SGD (momentum, weight decay) in float64."""
    d, d_abs = g + H["weight_decay"] * p, g.abs() + H["weight_decay"] * p.abs()
    buf = st.get("momentum_buffer")
    b, b_abs = (d, d_abs) if buf is None else (H["momentum"] * buf + d, H["momentum"] * buf.abs() + d_abs)
    new, mag = p - H["lr"] * b, p.abs() + H["lr"] * b_abs
    return new, gamma(K) * mag, {"momentum_buffer": (b, gamma(K_STATE["momentum_buffer"]) * b_abs)}


# -- compare --
ratios: list[float] = []
for i, (p, p_before, g, st) in enumerate(zip(params, P0, G, STATE, strict=True)):
    new, budget, states = reference(p_before.double(), g.double() / SCALE, {k: v.double() for k, v in st.items()})
    results = [("parameter", p.detach(), new, budget)]
    results += [(k, opt.state[p].get(k), r, b) for k, (r, b) in states.items()]
    for entry, got, ref, bound in results:
        if got is None:
            print(f"parameter {i}: the step kept no {entry}")
            ratios.append(math.inf)
            continue
        err = (got.double() - ref).abs()
        ratio = float(torch.where(err == 0, 0.0, err / bound).max())  # NaN stays NaN
        if not ratio <= 1:
            print(f"parameter {i}, {entry}: worst error {ratio:.3g} x its budget")
        ratios.append(ratio)
measured = math.nan if any(r != r for r in ratios) else max(ratios)  # the worst error, in units of its budget
allowed = 1.0

# -- unscale --
MAX_NORM = 1.0  # clip_grad_norm_'s max norm
FOREACH = False  # its implementation


def unscaled() -> Loaded:  # loaded, then the gradients unscaled in place
    params, opt, scaler = load()
    scaler.unscale_(opt)
    return params, opt, scaler


# -- clip_float64 --
params, opt, scaler = unscaled()
norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH))
# reference: clipping by its definition in float64 from the gradients unscaled exactly (SCALE is a
# power of two): norm = sqrt(sum g^2), coefficient min(1, max_norm / (norm + 1e-6))
g64 = [g.double() / SCALE for g in G]
n = sum(g.numel() for g in g64)
ref_norm = math.sqrt(sum(float((g * g).sum()) for g in g64))
coef = min(1.0, MAX_NORM / (ref_norm + 1e-6))
# budgets: the norm's n squares, n - 1 sums and root (gamma_(n+1)); each gradient adds the
# coefficient's sum and quotient and the product (gamma_(n+4)), plus float32's smallest subnormal
ratios = [abs(norm - ref_norm) / (gamma(n + 1) * ref_norm)]
print(f"total norm: torch {norm!r}, float64 {ref_norm!r} (coefficient {coef:.6g})")
for p, g in zip(params, g64, strict=True):
    clipped = g * coef
    grad: Any = p.grad
    ratios.append(float(((grad.double() - clipped).abs() / (gamma(n + 4) * clipped.abs() + 2.0**-149)).max()))
measured = math.nan if any(r != r for r in ratios) else max(ratios)  # the worst error, in units of its budget
allowed = 1.0

# -- clip_non_finite --
params, opt, scaler = unscaled()
norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH))
scaler.step(opt)
scaler.update()
# reference: an inf/NaN gradient has a non-finite norm (never a finite sentinel), GradScaler skips
# the step (nothing moves, bitwise) and halves the scale
wrong = [f"clip_grad_norm_ returned a finite norm {norm!r}"] if math.isfinite(norm) else []
wrong += [f"the skipped step changed {w}" for w in untouched(params, opt)]
if scaler.get_scale() != SCALE * 0.5:
    wrong.append(f"the scale went {SCALE!r} -> {scaler.get_scale()!r}, not halved")
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0

# -- clip_error --
params, opt, scaler = unscaled()
kept = [p.grad.clone() for p in params if p.grad is not None]
planted = any(not bool(g.isfinite().all()) for g in G)
raised: str | None = None
try:
    torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH, error_if_nonfinite=True)
except RuntimeError as exc:
    raised = str(exc).splitlines()[0]
if raised is None:
    scaler.step(opt)
scaler.update()
# reference: error_if_nonfinite=True raises on a non-finite norm with the gradients as they were
# (and the step is skipped); with finite gradients it never raises
wrong = []
if planted and raised is None:
    wrong.append("a non-finite gradient, and no error raised")
if not planted and raised is not None:
    wrong.append(f"finite gradients, yet clip_grad_norm_ raised: {raised}")
if planted and not all(p.grad is not None and same(p.grad, k) for p, k in zip(params, kept, strict=True)):
    wrong.append("the gradients changed although clipping refused")
if planted:
    wrong += [f"the skipped step changed {w}" for w in untouched(params, opt)]
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0
