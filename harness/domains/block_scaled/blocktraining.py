"""Block-scaled (MX, NVFP4) linears in the training suite's loop.

A model's ``nn.Linear`` modules whose in and out features are whole blocks are swapped for
:class:`BlockScaledLinear`, whose product is a :class:`~harness.domains.block_scaled.blocklinear.BlockLinear`'s
``mm`` (torchao's MX linear, or NVFP4 emulated over a quantiser): the rule torchao's own
conversion applies (a linear whose features are not whole blocks stays in high precision). The
others run as they would in fp32, so a setup records which linears it converted.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from harness.domains.block_scaled.blocklinear import (
    BlockLinear,
    EmulatedBlockLinear,
    TorchaoBlockLinear,
    linear_products,
    product_budgets,
    torchao_script,
)
from harness.domains.block_scaled.blockquant import TorchBlockScaling
from harness.domains.engines.scaled.band import FP8_PARITY_FRACTION
from harness.domains.engines.scaled.localise import Localised, fp32_state_at, over_budget, seen_by_linears
from harness.domains.engines.scaled.products import product_against_float64
from harness.domains.engines.training import amp_lane as L
from harness.domains.engines.training.loop import Run, step_from, train
from harness.domains.engines.training.recipes import FP32, INIT_SEED, Recipe, Setup, to_device
from harness.numerics import blockscaled as B
from harness.numerics.comparison import ClaimComparison, compare_claim
from harness.numerics.formats import FP8_E4M3FN


class BlockScaledLinear(nn.Linear):
    """An ``nn.Linear`` whose three products are ``linear.mm``'s under ``spec``; leading input
    dimensions are flattened into the batch (the weight gradient's contraction)."""

    def __init__(self, in_features: int, out_features: int, bias: bool, linear: BlockLinear, spec: B.BlockSpec) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.block_linear = linear
        self.spec = spec

    @classmethod
    def from_linear(cls, m: nn.Linear, linear: BlockLinear, spec: B.BlockSpec) -> BlockScaledLinear:
        new = cls(m.in_features, m.out_features, m.bias is not None, linear, spec)
        new.load_state_dict(m.state_dict())
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        block = self.spec.block[1]
        if torch.is_grad_enabled() and rows.shape[0] % block:
            raise ValueError(
                f"{self.spec.name}: a batch of {rows.shape[0]} rows is not a whole number of {block}-element blocks "
                "along the weight gradient's contraction; use a batch (x sequence length) divisible by it"
            )
        out = self.block_linear.mm(rows, self.weight, self.spec).reshape(*x.shape[:-1], self.out_features)
        return out + self.bias if self.bias is not None else out


def convertible(m: nn.Linear, spec: B.BlockSpec) -> bool:
    """Whether both of ``m``'s feature counts are whole blocks of ``spec`` (torchao's filter)."""
    block = spec.block[1]
    return m.in_features % block == 0 and m.out_features % block == 0


def convert(model: nn.Module, linear: BlockLinear, spec: B.BlockSpec) -> list[str]:
    """Swap every convertible ``nn.Linear`` of ``model`` in place; the names of those swapped."""
    swapped = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear and convertible(child, spec):
                setattr(module, child_name, BlockScaledLinear.from_linear(child, linear, spec))
                swapped.append(f"{name}.{child_name}" if name else child_name)
    return swapped


def block_recipe(spec_id: str) -> Recipe:
    """The recipe label of a block-scaled run (the loop runs it as fp32: the linears hold the casts)."""
    return Recipe(spec_id)


#: block_setup's setups, by (setup, recipe, the linear's id); each entry holds its linear, so the id
#: stays that object's while the entry lives
_SETUPS: dict[tuple[Setup, str, int], tuple[BlockLinear, Setup]] = {}


def block_setup(setup: Setup, spec_id: str, linear: BlockLinear) -> Setup:
    """``setup`` with its convertible linears block-scaled by ``linear`` under ``spec_id`` (one
    object per arguments, so that a run cache finds its runs again)."""
    key = (setup, spec_id, id(linear))
    if key not in _SETUPS:
        _SETUPS[key] = (linear, _block_setup(setup, spec_id, linear))
    return _SETUPS[key][1]


def _block_setup(setup: Setup, spec_id: str, linear: BlockLinear) -> Setup:
    spec = B.SPECS[spec_id]

    def model(seed: int) -> nn.Module:
        m = setup.model(seed)
        convert(m, linear, spec)
        return m

    return dataclasses.replace(setup, name=f"{setup.name}+{spec_id}", model=model)


def converted(setup: Setup, spec_id: str) -> tuple[list[str], int]:
    """Which of ``setup``'s linears a block-scaled run converts, and how many linears it has."""
    m = setup.model(0)
    total = sum(1 for x in m.modules() if type(x) is nn.Linear)
    return [n for n, x in m.named_modules() if type(x) is nn.Linear and convertible(x, B.SPECS[spec_id])], total


def parity_fraction(spec: B.BlockSpec) -> float:
    """The fraction of the fp32 seed band a block-scaled run may move the evaluation loss: float8's
    measured rule (:data:`~harness.domains.engines.scaled.band.FP8_PARITY_FRACTION`, e4m3 and e5m2 casts)
    scaled by the element format's unit roundoff against e4m3's, as a loss perturbation is first
    order in the casts' relative error: 2 bands for MXFP8, 8 for MXFP4 and NVFP4 (e2m1's u is 4x).
    Measured false alarms and gaps: ``scripts/block_training_rates.py``, docs/fp8.md."""
    return FP8_PARITY_FRACTION * spec.elem.unit_roundoff / FP8_E4M3FN.unit_roundoff


# -- the AMP lane of a block-scaled recipe -----------------------------------------------------------
#: The correctly rounded block-scaled recipe: the harness's own quantiser (the specification as code,
#: checked against the exact reference by suites/block_scaled/test_block_scaling.py) with float64 products.
CORRECTLY_ROUNDED = EmulatedBlockLinear(TorchBlockScaling())


def block_lane_reference(setup: Setup, spec_id: str, run: Run, device: torch.device | str = "cpu") -> L.LaneReference:
    """From each state ``run`` kept (a block-scaled run of ``setup``): the exact step (the plain
    model in float64) and the step of the same recipe correctly rounded (every product's operands
    quantised by the specification, multiplied in float64, fp32 master weights)."""
    if not run.states:
        raise ValueError(f"run {run.recipe!r} kept no states: train it with keep_states_at=lane_steps(setup)")
    names, _ = converted(setup, spec_id)
    emulated_setup = block_setup(setup, spec_id, CORRECTLY_ROUNDED)
    exact, before, emulated, steps = {}, {}, {}, {}
    for t, state in sorted(run.states.items()):
        b64, a64 = step_from(setup, FP32, state, device, params_dtype=torch.float64)
        b, a = step_from(emulated_setup, FP32, state, device, params_dtype=torch.float64)
        if not (bool(torch.isfinite(a64).all()) and bool(torch.isfinite(a).all())):
            continue
        exact[t], before[t], steps[t] = a64 - b64, b64, a.float().double() - b
        emulated[t] = L.relative_error(steps[t], a64 - b64)
    spec = B.SPECS[spec_id]
    return L.LaneReference(
        setup.name,
        torch.float64,
        exact,
        before,
        emulated,
        len(names),
        label=f"{spec_id} ({spec.describe()})",
        emulated_steps=steps,
    )


def block_lane(
    setup: Setup,
    spec_id: str,
    linear: BlockLinear,
    run: Run,
    reference: L.LaneReference | None = None,
    device: torch.device | str = "cpu",
) -> tuple[L.AmpLane, L.LaneReference]:
    """``linear``'s step under ``spec_id`` from each state of ``run`` against the exact and the
    correctly rounded step (:func:`harness.domains.engines.training.amp_lane.judge_lane` judges it: at most
    LANE_FACTOR times the correctly rounded step's error, one element significand bit fewer)."""
    ref = reference if reference is not None else block_lane_reference(setup, spec_id, run, device)
    lane = L.amp_lane(block_setup(setup, spec_id, linear), block_recipe(spec_id), run, ref, device, kernel=False)
    # a state the reference could not step from is one the run itself left finite arithmetic in
    # (a block-scaled recipe has no scaler to skip a step): it counts as an infinitely wrong step
    lost = tuple(L.StepError(t, math.inf, 0.0) for t in lane.left_out)
    errors = tuple(sorted(lane.errors + lost, key=lambda e: e.step))
    return dataclasses.replace(lane, setup=setup.name, recipe=spec_id, errors=errors), ref


@dataclass(frozen=True)
class StepConformance:
    """From each kept state: how far the implementation's step lies from the correctly rounded one
    (float64 products), and how far the same correctly rounded recipe evaluated in float32 lies
    from it: what float32 evaluation alone (products, scale arithmetic) moves a step."""

    setup: str
    spec_id: str
    implementation: str
    steps: tuple[int, ...]
    distance: tuple[float, ...]
    float32: tuple[float, ...]

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(L.ratio_of(d, f) for d, f in zip(self.distance, self.float32, strict=True))

    @property
    def ratio(self) -> float:
        """Median over checkpoints of distance / float32's distance (inf with none)."""
        return statistics.median(self.ratios) if self.ratios else math.inf


def _apart(d: torch.Tensor, ref: torch.Tensor, size: float) -> float:
    """||d - ref|| / size (inf where not finite)."""
    apart = float((d - ref).norm())
    return apart / size if math.isfinite(apart) and size > 0 else math.inf


def step_conformance(
    setup: Setup,
    spec_id: str,
    linear: BlockLinear,
    run: Run,
    reference: L.LaneReference,
    device: torch.device | str = "cpu",
) -> StepConformance:
    """``linear``'s step from each state of ``run`` against :func:`block_lane_reference`'s correctly
    rounded step, beside the correctly rounded recipe's own float32 evaluation."""
    impl = block_setup(setup, spec_id, linear)
    own32 = block_setup(setup, spec_id, CORRECTLY_ROUNDED)
    steps, distance, float32 = [], [], []
    for t in sorted(run.states):
        steps.append(t)
        if t not in reference.emulated_steps:  # the run's own state is not finite (block_lane)
            distance.append(math.inf)
            float32.append(0.0)
            continue
        d_emu = reference.emulated_steps[t]
        size = float(reference.exact[t].norm())
        b, a = step_from(impl, block_recipe(spec_id), run.states[t], device)
        b32, a32 = step_from(own32, block_recipe(spec_id), run.states[t], device)
        distance.append(_apart(a - b, d_emu, size))
        float32.append(_apart(a32 - b32, d_emu, size))
    return StepConformance(setup.name, spec_id, linear.name, tuple(steps), tuple(distance), tuple(float32))


def judge_conformance(c: StepConformance, rerun: str = "") -> ClaimComparison:
    """The implementation's step is the specification's: at most LANE_FACTOR times as far from the
    correctly rounded step as float32 evaluation of the specification itself (median over
    checkpoints). ``rerun``: how to reproduce the run (default: :func:`check_block_steps`)."""
    per_step = ", ".join(
        f"step {t + 1}: {d:.3g} vs {f:.3g} ({L.ratio_of(d, f):.3g}x)"
        if math.isfinite(d)
        else f"step {t + 1}: the run's state is not finite"
        for t, d, f in zip(c.steps, c.distance, c.float32, strict=True)
    )
    return compare_claim(
        f"{c.setup}.{c.spec_id}.step_distance_over_float32s",
        c.ratio,
        c.ratio <= L.LANE_FACTOR,
        f"median over checkpoints of |step - correctly rounded step| / |the specification's own float32 step - "
        f"correctly rounded step| <= {L.LANE_FACTOR:g} (distances relative to the float64 step's size)",
        detail=(
            f"{c.setup} / {c.spec_id} ({c.implementation}): its training steps lie a median {c.ratio:.3g}x as far from "
            "the correctly rounded block-scaled step as float32 evaluation of the same specification does "
            f"(allowed {L.LANE_FACTOR:g}x): the implementation quantises or multiplies otherwise than the recipe says",
            f"per step (distance, float32's): {per_step}",
            "reproduce: "
            + (rerun or f"harness.api.check_block_steps(<the {c.setup} setup>, {c.spec_id!r}, <the linear>, seed=0)"),
        ),
        allowance=L.LANE_FACTOR,
        unit="x",
    )


def check_block_steps(
    setup: Setup, spec_id: str, linear: BlockLinear, seed: int = 0, device: torch.device | str = "cpu"
) -> tuple[ClaimComparison, ClaimComparison]:
    """Train ``setup`` with its whole-block linears made ``linear`` under ``spec_id`` and judge its
    steps from the lane's checkpoints: (as accurate as the correctly rounded step, the
    specification's step up to float32). Each result's ``passed`` and ``explain()`` say the verdict.

    Example::

        accurate, conforms = check_block_steps(Setup("mine", build, batch, loss, steps=40), "mxfp8-rceil", my_linear)
        assert accurate.passed and conforms.passed, conforms.explain()
    """
    run = train(
        block_setup(setup, spec_id, linear), block_recipe(spec_id), seed, device, keep_states_at=L.lane_steps(setup)
    )
    lane, reference = block_lane(setup, spec_id, linear, run, device=device)
    return L.judge_lane(lane), judge_conformance(step_conformance(setup, spec_id, linear, run, reference, device))


def first_block_linear_over_budget(
    setup: Setup, spec_id: str, linear: BlockLinear, failed_step: int, device: torch.device | str = "cpu"
) -> tuple[Localised | None, int]:
    """Localise a block-scaled run that left its band: at ``failed_step``, from the fp32 run's
    weights then, on the evaluation batch (:func:`~harness.domains.engines.scaled.localise.fp32_state_at`,
    :func:`block_linear_over_budget`)."""
    weights, batch = fp32_state_at(setup, failed_step, device)
    return block_linear_over_budget(setup, spec_id, linear, weights, batch, device)


def block_linear_over_budget(
    setup: Setup,
    spec_id: str,
    linear: BlockLinear,
    weights: dict[str, torch.Tensor],
    batch: Any,
    device: torch.device | str = "cpu",
) -> tuple[Localised | None, int]:
    """One step of ``setup`` at ``weights`` on ``batch`` with its convertible linears block-scaled
    by ``linear``: each block-scaled linear's three products taken again from what it saw, against
    their budgets (:func:`harness.domains.block_scaled.blocklinear.product_budgets`). The first over its
    budget (with torchao's script when ``linear`` is torchao's), and how many were judged."""
    spec = B.SPECS[spec_id]
    dev = torch.device(device)
    model = block_setup(setup, spec_id, linear).model(INIT_SEED).to(dev)
    model.load_state_dict(weights, strict=False)  # the block-scaled linears hold the same parameters
    inputs, targets = to_device(batch, dev)
    seen = seen_by_linears(model, lambda: setup.loss_on(model, inputs, targets), BlockScaledLinear)
    for s in seen:
        got = linear_products(linear, s.x, s.w, s.go, spec)
        for name, (ref, bud) in product_budgets(s.x, s.w, s.go, spec).items():
            worst = over_budget(getattr(got, name), ref, bud)
            if worst <= 1.0:
                continue
            repro = None
            if type(linear) is TorchaoBlockLinear:  # a script needs nothing of the harness: torchao's calls
                repro = product_against_float64(
                    "block_scaled",
                    f"torchao block-scaled linear ({spec_id}) {name} of the model's linear {s.path!r} against float64",
                    torchao_script(spec, name),
                    {"x": s.x, "w": s.w, "go": s.go},
                    bud.bound,
                    bud.sqnr_floor_db,
                    bud.origin,
                    needs=("torch", "torchao"),
                )
            return Localised(s.path, name, worst, len(seen), repro), len(seen)
    return None, len(seen)
