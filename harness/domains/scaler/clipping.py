"""Gradient clipping under AMP as users run it: ``unscale_`` -> ``clip_grad_norm_`` -> ``step``.

Nearly every LLM recipe clips between GradScaler's ``unscale_`` and ``step``. What a stack must
do there, and what :func:`observe` records for the suite to judge:

* the total norm ``clip_grad_norm_`` returns and the gradients it leaves equal clipping computed
  here from its definition in float64 (:func:`clip_reference`), never torch's own clip, within
  float32's reduction budget; the coefficient is recorded;
* a non-finite gradient element gives a non-finite norm (a finite sentinel such as -1 would make
  the coefficient negative and flip every gradient's sign), and GradScaler skips the step:
  parameters and optimizer state bitwise untouched, the scale backed off;
* ``error_if_nonfinite=True`` raises on a non-finite norm and leaves the gradients as they were.

Both of ``clip_grad_norm_``'s implementations run (``foreach=False`` and ``True``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from harness.domains.engines.state import differences, same_bits, state_of
from harness.domains.scaler.optimizers import small_model
from harness.numerics.comparison import ClaimComparison, ElementwiseComparison, compare_claim, compare_within
from harness.numerics.formats import FP32, format_of
from harness.numerics.tolerance import gamma

#: clip_grad_norm_'s implementations: per-tensor norms in a loop, or torch._foreach_norm.
IMPLEMENTATIONS = {"for-loop": False, "foreach": True}
#: Maximum norms of the observed steps, in turn: binding (far below the gradients' norm, ~0.3 on
#: the model below), near the norm, and never binding, so both sides of min(1, ...) are judged.
MAX_NORMS = (1e-3, 0.25, 1e3)
STEPS = 6
#: The non-finite values planted in one scaled gradient element, in turn.
NON_FINITE = (math.inf, math.nan, -math.inf)
#: torch.nn.utils.clip_grad_norm_'s epsilon in its coefficient max_norm / (total_norm + 1e-6)
CLIP_EPS = 1e-6


@dataclass(frozen=True)
class Clipped:
    """Gradient clipping computed in float64: the total 2-norm, the coefficient and the clipped
    gradients, with each element's budget for the same clipping done in float32."""

    total_norm: float
    coefficient: float
    grads: list[torch.Tensor]
    budgets: list[torch.Tensor]
    origin: str


def norm_budget(grads: list[torch.Tensor]) -> float:
    """The total norm's relative float32 budget: n squares, n - 1 additions and the square root
    of positive terms err by at most gamma_{n+1} (torch sums per-tensor norms: the same count)."""
    return gamma(sum(g.numel() for g in grads) + 1, FP32.unit_roundoff)


def clip_reference(grads: list[torch.Tensor], max_norm: float) -> Clipped:
    """``clip_grad_norm_(max_norm)`` of ``grads`` (unscaled), from its definition in float64:
    norm = sqrt(sum g^2) over every element, coefficient min(1, max_norm / (norm + 1e-6)).

    Budget (float32): the norm's n squares and n - 1 additions and its square root err by at most
    gamma_{n+1} relatively (positive terms; torch sums per-tensor norms, the same count), the
    coefficient's addition and division add 2 roundings, the product one: gamma_{n+4} |clipped|."""
    g64 = [g.detach().to("cpu", torch.float64) for g in grads]
    n = sum(g.numel() for g in g64)
    norm = math.sqrt(sum(float((g * g).sum()) for g in g64))
    coef = min(1.0, max_norm / (norm + CLIP_EPS))
    rel = gamma(n + 4, FP32.unit_roundoff)
    clipped = [g * coef for g in g64]
    eta = FP32.smallest_subnormal  # a product that underflows
    return Clipped(
        norm,
        coef,
        clipped,
        [rel * c.abs() + eta for c in clipped],
        f"clip_grad_norm_({max_norm:g}) from its definition in float64 (norm {norm:.6g}, coefficient "
        f"{coef:.6g}); float32 budget gamma_{n + 4}(2^-24) |clipped| (n = {n} squares and sums, the "
        f"square root, the coefficient, the product)",
    )


@dataclass(frozen=True)
class ClipObservation:
    """One step: the max norm, the unscaled gradients (computed here from the scaled ones in
    float64), what clip_grad_norm_ returned and left, and for a planted non-finite element what
    the step did with the parameters, the optimizer state and the scale."""

    max_norm: float
    planted: float | None
    unscaled: list[torch.Tensor]
    norm: float
    clipped: list[torch.Tensor]
    changed: tuple[str, ...]
    scale_before: float
    scale_after: float
    #: error_if_nonfinite=True: the error raised (None: none) and whether the gradients were kept
    raised: str | None = None
    kept_gradients: bool = True
    #: what a script needs to take this step alone: the parameters, the optimizer's state and the
    #: scaled gradients (the planted element included) before it
    params_before: tuple[torch.Tensor, ...] = ()
    state_before: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    grads_scaled: tuple[torch.Tensor, ...] = ()


def observe(
    foreach: bool, device: torch.device, non_finite: bool = False, error_if_nonfinite: bool = False
) -> list[ClipObservation]:
    """:data:`STEPS` steps of a small fp16-autocast model under GradScaler with SGD (momentum):
    each ``unscale_`` -> ``clip_grad_norm_(MAX_NORMS[t % 3], foreach=foreach)`` -> ``step``;
    ``non_finite``: each step has one of :data:`NON_FINITE` planted in a scaled gradient element;
    ``error_if_nonfinite``: clip_grad_norm_ is asked to raise on a non-finite norm (a raised step
    is not taken)."""
    model = small_model(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10)
    g = torch.Generator().manual_seed(1)
    out: list[ClipObservation] = []
    for t in range(STEPS):
        x, y = torch.randn(32, 8, generator=g).to(device), torch.randn(32, 1, generator=g).to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        planted = NON_FINITE[t % len(NON_FINITE)] if non_finite else None
        if planted is not None:
            grad = params[t % len(params)].grad
            assert grad is not None
            grad.view(-1)[grad.numel() // 2] = planted
        scale = float(scaler.get_scale())
        scaled = tuple(p.grad.detach().clone() for p in params if p.grad is not None)
        # the float64 references are computed on the CPU, whatever the device under test
        unscaled = [g.to(torch.float64).cpu() / scale for g in scaled]
        before = [p.detach().clone() for p in params]
        state_before = state_of(opt, params)
        scaler.unscale_(opt)
        kept = [p.grad.detach().cpu() for p in params if p.grad is not None]
        max_norm = MAX_NORMS[t % len(MAX_NORMS)]
        raised: str | None = None
        norm = math.nan
        try:
            norm = float(
                torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach, error_if_nonfinite=error_if_nonfinite)
            )
        except RuntimeError as e:
            raised = str(e).splitlines()[0]
        clipped = [p.grad.detach().cpu() for p in params if p.grad is not None]
        same = all(same_bits(a, b) for a, b in zip(kept, clipped, strict=True))
        if raised is None:
            scaler.step(opt)
        scaler.update()
        state_after = state_of(opt, params)
        changed = differences(before, [p.detach() for p in params], state_before, state_after)
        out.append(
            ClipObservation(
                max_norm,
                planted,
                unscaled,
                norm,
                clipped,
                tuple(changed),
                scale,
                float(scaler.get_scale()),
                raised,
                same,
                tuple(before),
                state_before,
                scaled,
            )
        )
    return out


# -- the claims: each check's verdict, decided here -------------------------------------------------
def binding_claim(implementation: str, coefficients: list[float]) -> ClaimComparison:
    """The precondition of the float64 comparison: clipping binds on some steps and not on others
    (coefficient ``min(1, max_norm / norm)`` below 1 on some), so both sides are judged."""
    binding = sum(c < 1.0 for c in coefficients)
    return compare_claim(
        f"clip.{implementation}.binding_steps",
        binding,
        0 < binding < len(coefficients),
        "clipping binds on some steps and not on others, so both sides of min(1, max_norm / norm) are judged",
        detail=f"coefficients {[f'{c:.3g}' for c in coefficients]}",
        inconclusive=True,
    )


@dataclass(frozen=True)
class Judged:
    """A claim over several steps, and the first step that broke it (its script), if any."""

    claim: ClaimComparison
    first: ClipObservation | None


def non_finite_claim(implementation: str, steps: list[ClipObservation]) -> Judged:
    """+inf, NaN or -inf planted in one scaled gradient element: a non-finite norm (never a finite
    sentinel), the step skipped (parameters and optimizer state bitwise unchanged), the scale
    halved."""
    problems: list[str] = []
    first = None
    for t, o in enumerate(steps):
        before = len(problems)
        if math.isfinite(o.norm):
            problems.append(f"step {t}: {o.planted} planted, clip_grad_norm_ returned a finite norm {o.norm:g}")
        if o.changed:
            problems.append(f"step {t}: {o.planted} planted, the step changed {', '.join(o.changed)}")
        if o.scale_after != o.scale_before * 0.5:
            problems.append(f"step {t}: the scale went {o.scale_before:g} -> {o.scale_after:g}, not halved")
        if first is None and len(problems) > before:
            first = o
    claim = compare_claim(
        f"clip.{implementation}.non_finite_norm_skips",
        len(problems),
        not problems,
        "+inf, NaN or -inf in one scaled gradient element: unscale_ then clip_grad_norm_ returns a non-finite "
        "norm (never a finite sentinel, which would flip or scale every gradient), GradScaler skips the step "
        "(parameters and optimizer state bitwise unchanged) and halves the scale",
        detail=problems or f"{len(steps)} steps, each skipped with a non-finite norm",
        expected=0,
        allowance=0,
        unit="violations",
    )
    return Judged(claim, first)


def error_if_nonfinite_claim(
    implementation: str, non_finite: list[ClipObservation], finite: list[ClipObservation]
) -> Judged:
    """``error_if_nonfinite=True``: every non-finite total norm raises with the gradients bitwise as
    they were and the step not taken; finite gradients never raise."""
    problems: list[str] = []
    first = None
    for t, o in enumerate(non_finite):
        before = len(problems)
        if o.raised is None:
            problems.append(f"step {t}: {o.planted} planted, no error raised (norm {o.norm:g})")
        if not o.kept_gradients:
            problems.append(f"step {t}: the gradients changed although clipping refused")
        if o.changed:
            problems.append(f"step {t}: the step changed {', '.join(o.changed)}")
        if first is None and len(problems) > before:
            first = o
    for t, o in enumerate(finite):
        if o.raised is not None:
            problems.append(f"step {t}: finite gradients, yet clip_grad_norm_ raised: {o.raised}")
            first = first or o
    claim = compare_claim(
        f"clip.{implementation}.error_if_nonfinite",
        len(problems),
        not problems,
        "error_if_nonfinite=True: a non-finite total norm raises RuntimeError with the gradients bitwise "
        "as they were; finite gradients never raise",
        detail=problems or "every non-finite norm raised, every finite one clipped",
        expected=0,
        allowance=0,
        unit="violations",
    )
    return Judged(claim, first)


# -- low-precision gradients: pure bf16/fp16 training clips its own gradients ----------------------
#: Total norms of the low-precision gradients: one inside every format's range, one beyond
#: float16's largest finite value (65504) though every element is finite.
LOW_PRECISION_NORMS = (100.0, 1e5)
#: float16's largest finite value: a total norm beyond it is the registered overflow's shape.
FP16_MAX = 65504.0
#: Elements per gradient (two parameters): the norm sums 2 * 4096 squares.
LOW_PRECISION_SIZE = 4096


@dataclass(frozen=True)
class LowPrecisionClip:
    """``clip_grad_norm_(max_norm=1)`` of two low-precision gradients of total norm ``target``:
    what it returned and left, against the float64 definition on the same gradients."""

    dtype: torch.dtype
    target: float
    norm: float
    reference: Clipped
    clipped: list[torch.Tensor]
    budget_norm: float
    budget: list[torch.Tensor]


def clip_low_precision(dtype: torch.dtype, foreach: bool, target: float, device: torch.device) -> LowPrecisionClip:
    """Two ``dtype`` parameters whose gradients (seeded, every element finite in ``dtype``) have
    total norm ``target``, clipped to 1 by ``clip_grad_norm_``. Budget: the norm is accumulated in
    fp32 (n squares and sums: gamma_n of 2^-24) and returned in ``dtype`` (one rounding, u); the
    clipped elements add the coefficient's fp32 division and the product's rounding to ``dtype``
    (one u more): 2u + gamma_{n+4}(2^-24), relative."""
    g = torch.Generator().manual_seed(int(target))
    raw = [torch.randn(LOW_PRECISION_SIZE, generator=g, dtype=torch.float64) for _ in range(2)]
    scale = target / math.sqrt(sum(float((r * r).sum()) for r in raw))
    params = [torch.nn.Parameter(torch.zeros(LOW_PRECISION_SIZE, dtype=dtype, device=device)) for _ in raw]
    for p, r in zip(params, raw, strict=True):
        p.grad = (r * scale).to(dtype).to(device)
    grads = [p.grad.detach().clone() for p in params if p.grad is not None]
    reference = clip_reference(grads, 1.0)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm=1.0, foreach=foreach))
    u = format_of(dtype).unit_roundoff
    rel = 2 * u + gamma(2 * LOW_PRECISION_SIZE + 4, FP32.unit_roundoff)
    eta = format_of(dtype).smallest_subnormal
    return LowPrecisionClip(
        dtype,
        target,
        norm,
        reference,
        [p.grad.detach().to("cpu", torch.float64) for p in params if p.grad is not None],
        rel * reference.total_norm,
        [rel * c.abs() + eta for c in reference.grads],
    )


def low_precision_claim(implementation: str, seen: LowPrecisionClip) -> ElementwiseComparison:
    """The returned norm and the clipped gradients within their budget of the float64 definition."""
    got = torch.cat([torch.tensor([seen.norm], dtype=torch.float64), *(c.flatten() for c in seen.clipped)])
    want = torch.cat([torch.tensor([seen.reference.total_norm]), *(r.flatten() for r in seen.reference.grads)])
    bound = torch.cat([torch.tensor([seen.budget_norm]), *(b.flatten() for b in seen.budget)])
    name = str(seen.dtype).removeprefix("torch.")
    return compare_within(
        f"clip.{implementation}.{name}_gradients_vs_float64",
        got,
        want,
        bound,
        f"clip_grad_norm_(1) of {name} gradients of total norm {seen.target:g}: the returned norm (first element) "
        f"and the clipped gradients against {seen.reference.origin}; budget 2u({name}) + gamma_n(2^-24), relative",
        what=f"|{implementation} clip_grad_norm_ of {name} gradients - float64|",
    )


def fp16_norm_overflows(device: torch.device) -> tuple[bool, str]:
    """The registered float16 issue observed: the for-loop clip of float16 gradients of norm 1e5
    returns a non-finite norm and zeroes them."""
    seen = clip_low_precision(torch.float16, False, LOW_PRECISION_NORMS[-1], device)
    zeroed = all(not bool(c.any()) for c in seen.clipped)
    return (not math.isfinite(seen.norm)) and zeroed, f"norm {seen.norm}, gradients {'zeroed' if zeroed else 'kept'}"
