"""The GradScaler state machine: torch's scaler driven through real training steps against the
float32-faithful reference (:mod:`harness.domains.scaler.reference`, torch semantics), the
rules and invariants of ``suites/scaler/test_gradscaler_state_machine.py``.

Rules: clean steps, inf/-inf/NaN in any parameter's gradient, overflow in one of two optimizers,
unscale_ + clip_grad_norm_, gradient accumulation, update(new_scale) with a float and a tensor,
state_dict round trips into a fresh scaler, growth-interval changes and the documented misuse
errors. After every rule the scale and growth tracker must equal the reference's; a skipped step
leaves parameters and optimizer state bit-identical; a taken step equals the optimizer's step on
gradients unscaled independently; unscale_ + clip_grad_norm_ equals clipping computed in float64.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import replace

import torch
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from harness.domains.engines.state import same_bits
from harness.domains.machines import RecordedMachine
from harness.domains.scaler import clipping
from harness.domains.scaler import known_issues as issues
from harness.domains.scaler import reference as scaling
from harness.numerics.comparison import ClaimComparison, compare_claim

#: Rules per example. The ci profile's 40 examples x 20 steps keep this suite within its budget.
STEPS = 20
#: Initial scales: ordinary (2^0..2^24) and near the float32 maximum (2^120..2^127), so that the
#: growth cap is reached within STEPS (growth interval <= 4, growth factor >= 2).
INIT_EXPONENTS = st.one_of(st.integers(0, 24), st.integers(120, 127))
#: A scaler/device with this registered known issue is held to the uncapped rule it is known to
#: follow, so the rest of its behaviour is still checked exactly (the registry test notices a fix).
UNCAPPED = issues.KNOWN_ISSUES["sharded-cpu-growth-uncapped"]


def _make_optimizer(kind: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for state in opt.state_dict()["state"].values():
        out += [
            v.detach().clone() if isinstance(v, torch.Tensor) else torch.tensor(float(v))
            for _, v in sorted(state.items())
        ]
    return out


def _grad(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient, which every rule's backward has made."""
    assert p.grad is not None
    return p.grad


def _bitwise(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Bitwise equal, NaN equal to NaN (an inf never equals the largest finite value)."""
    return len(a) == len(b) and all(same_bits(x, y) for x, y in zip(a, b, strict=True))


class GradScalerMachine(RecordedMachine):
    """torch's scaler (``scaler_cls``: GradScaler, ShardedGradScaler or a subclass) on ``device``
    driving a real model and optimizers, against the reference (torch semantics); run
    ``GradScalerMachine.bound(device=..., self.scaler_cls=...)``. Its transcript: each example's rules
    with what they drew, for :func:`harness.domains.scaler.repro.scaler_rules`."""

    device: torch.device
    scaler_cls: type[torch.amp.GradScaler]

    @initialize(
        growth_interval=st.integers(1, 4),
        init_exp=INIT_EXPONENTS,
        growth=st.sampled_from([2.0, 4.0]),
        backoff=st.sampled_from([0.5, 0.25]),
        opt_kind=st.sampled_from(["sgd", "adamw"]),
        two_optimizers=st.booleans(),
    )
    def setup(
        self, growth_interval: int, init_exp: int, growth: float, backoff: float, opt_kind: str, two_optimizers: bool
    ) -> None:
        self.start(
            {
                "growth_interval": growth_interval,
                "init_exp": init_exp,
                "growth": growth,
                "backoff": backoff,
                "opt_kind": opt_kind,
                "two_optimizers": two_optimizers,
            }
        )
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4), torch.nn.Linear(4, 1)
        ).to(self.device)
        self.params = list(self.model.parameters())
        self.opt_kind = opt_kind
        split = [self.params[:2], self.params[2:]] if two_optimizers else [self.params]
        self.opts = [_make_optimizer(opt_kind, p) for p in split]
        self.x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1)).to(self.device)
        self.y = torch.randn(16, 1, generator=torch.Generator().manual_seed(2)).to(self.device)
        self.cfg = scaling.ScalerConfig(
            init_scale=2.0**init_exp,
            growth_factor=growth,
            backoff_factor=backoff,
            growth_interval=growth_interval,
            cap_growth=not UNCAPPED.applies(torch.__version__, self.scaler_cls, self.device.type),
        )
        self.scaler = self.scaler_cls(
            self.device.type,
            init_scale=self.cfg.init_scale,
            growth_factor=growth,
            backoff_factor=backoff,
            growth_interval=growth_interval,
        )
        self.ref = scaling.ScalerState.initial(self.cfg)
        self.started = False

    # -- helpers ---------------------------------------------------------------------------
    def _backward(self, micro_batches: int = 1) -> None:
        for opt in self.opts:
            opt.zero_grad(set_to_none=False)
        for i in range(micro_batches):
            xs, ys = self.x[i::micro_batches], self.y[i::micro_batches]
            loss = torch.nn.functional.mse_loss(self.model(xs), ys) / micro_batches
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        self.started = True

    def _shadow(self, clipped: list[torch.Tensor] | None) -> list[torch.Tensor]:
        """Params after the optimizer step on gradients unscaled independently of the scaler
        (``clipped``: the step's clipped gradients, themselves checked against float64)."""
        model = copy.deepcopy(self.model)
        params = list(model.parameters())
        inv = torch.tensor(self.ref.scale, dtype=torch.float64).reciprocal().float().to(self.device)
        for i, (p, q) in enumerate(zip(self.params, params, strict=True)):
            q.grad = _grad(p).detach().clone() * inv if clipped is None else clipped[i].clone()
        index = {id(p): i for i, p in enumerate(self.params)}
        for opt in self.opts:
            shadow = _make_optimizer(self.opt_kind, [params[index[id(p)]] for p in opt.param_groups[0]["params"]])
            shadow.load_state_dict(copy.deepcopy(opt.state_dict()))
            shadow.step()
        return [p.detach().clone() for p in params]

    def _found_inf(self) -> list[bool]:
        """Per optimizer, whether its scaled gradients hold inf/NaN: injected, or a natural
        overflow of a scale near the float32 maximum. This is what the scaler must detect."""
        return [
            any(p.grad is not None and not bool(p.grad.isfinite().all()) for p in o.param_groups[0]["params"])
            for o in self.opts
        ]

    def _step_and_check(self, clip: float | None = None) -> None:
        found_inf_per_opt = self._found_inf()
        if any(found_inf_per_opt):
            self.counts["steps_with_inf"] += 1
        before_params = [p.detach().clone() for p in self.params]
        before_states = [_state_tensors(o) for o in self.opts]
        clipped = None
        if clip is not None:
            unscaled = [_grad(p).detach().to(torch.float64) / self.ref.scale for p in self.params]
            for opt in self.opts:
                self.scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(self.params, clip)
            clipped = [_grad(p).detach().clone() for p in self.params]
            if not any(found_inf_per_opt):
                # clipping against its definition in float64, never against torch's own clip
                ref = clipping.clip_reference(unscaled, clip)
                worst = max(
                    float(((c.to("cpu", torch.float64) - r).abs() / b).max())
                    for c, r, b in zip(clipped, ref.grads, ref.budgets, strict=True)
                )
                self.counts["clip_binding"] += ref.coefficient < 1.0
                assert worst <= 1.0, (  # verdict recorded by require_run
                    f"clip_grad_norm_({clip}) after unscale_ differs from clipping in float64 by {worst:.3g} "
                    f"times its budget: {ref.origin}"
                )
        expected = None if any(found_inf_per_opt) and len(self.opts) == 1 else self._shadow(clipped)
        for opt in self.opts:
            self.scaler.step(opt)
        self.scaler.update()
        self.ref = scaling.update("torch", self.cfg, self.ref, any(found_inf_per_opt))
        for opt, inf, before in zip(self.opts, found_inf_per_opt, before_states, strict=True):
            ids = {id(p) for p in opt.param_groups[0]["params"]}
            mine = [i for i, p in enumerate(self.params) if id(p) in ids]
            now = [self.params[i].detach() for i in mine]
            if inf:  # verdicts recorded by require_run
                if not _bitwise(now, [before_params[i] for i in mine]):
                    raise scaling.Divergence(scaling.Diverged.SKIPPED_STEP, "a skipped step changed the parameters")
                if not _bitwise(_state_tensors(opt), before):
                    raise scaling.Divergence(
                        scaling.Diverged.SKIPPED_STEP, "a skipped step changed the optimizer state (steps, moments)"
                    )
            elif expected is not None:
                assert _bitwise(now, [expected[i] for i in mine]), (  # verdict recorded by require_run
                    "a taken step differs from the optimizer's step on independently unscaled gradients"
                )

    def _corrupt(self, index: int, value: float) -> None:
        grad = self.params[index].grad
        assert grad is not None
        grad.view(-1)[0] = value

    # -- rules -----------------------------------------------------------------------------
    @rule()
    def clean_step(self) -> None:
        self.counts["clean_step"] += 1
        self.record("clean_step", {})
        self._backward()
        self._step_and_check()

    @rule(index=st.integers(0, 5), value=st.sampled_from([math.inf, -math.inf, math.nan]))
    def overflow_step(self, index: int, value: float) -> None:
        self.counts["overflow_step"] += 1
        self.record("overflow_step", {"index": index, "value": value})
        self._backward()
        self._corrupt(index, value)
        self._step_and_check()

    @rule(max_norm=st.sampled_from([1e-3, 0.1, 10.0]))
    def clipped_step(self, max_norm: float) -> None:
        self.counts["clipped_step"] += 1
        self.record("clipped_step", {"max_norm": max_norm})
        self._backward()
        self._step_and_check(clip=max_norm)

    @rule(micro_batches=st.integers(2, 4), overflow=st.booleans())
    def accumulated_step(self, micro_batches: int, overflow: bool) -> None:
        self.counts["accumulated_step"] += 1
        self.record("accumulated_step", {"micro_batches": micro_batches, "overflow": overflow})
        self._backward(micro_batches)
        if overflow:
            self._corrupt(0, math.inf)
        self._step_and_check()

    @precondition(lambda self: self.started)
    @rule(exponent=st.integers(-4, 30), as_tensor=st.booleans())
    def set_scale(self, exponent: int, as_tensor: bool) -> None:
        self.counts["set_scale"] += 1
        self.record("set_scale", {"exponent": exponent, "as_tensor": as_tensor})
        value = 2.0**exponent
        self.scaler.update(torch.tensor(value, device=self.device) if as_tensor else value)
        self.ref = scaling.set_scale(self.ref, value)

    @precondition(lambda self: self.started)
    @rule()
    def reload_into_a_fresh_scaler(self) -> None:
        self.counts["reload"] += 1
        self.record("reload_into_a_fresh_scaler", {})
        fresh = self.scaler_cls(self.device.type)
        fresh.load_state_dict(self.scaler.state_dict())
        self.scaler = fresh
        # a loaded scaler creates its scale tensor at the next scale(): update(new_scale) before
        # that raises (recorded as known issue "update-before-scale-after-load")
        self.started = False

    @rule(interval=st.integers(1, 4))
    def change_growth_interval(self, interval: int) -> None:
        self.counts["growth_interval"] += 1
        self.record("change_growth_interval", {"interval": interval})
        self.scaler.set_growth_interval(interval)
        self.cfg = replace(self.cfg, growth_interval=interval)

    @rule(misuse=st.sampled_from(["unscale_twice", "unscale_after_step", "step_twice", "closure"]))
    def documented_misuse_raises(self, misuse: str) -> None:
        self.counts[f"misuse:{misuse}"] += 1
        self.record("documented_misuse_raises", {"misuse": misuse})
        self._backward()
        overflowed = any(self._found_inf())  # near the top of float32 a scaled loss overflows by itself
        opt = self.opts[0]
        messages = {
            "unscale_twice": "unscale_() has already been called on this optimizer since the last update()",
            "unscale_after_step": "unscale_() is being called after step()",
            "step_twice": "step() has already been called since the last update()",
            "closure": "Closure use is not currently supported if GradScaler is enabled",
        }
        if misuse in ("unscale_twice",):
            self.scaler.unscale_(opt)
        if misuse in ("unscale_after_step", "step_twice"):
            self.scaler.step(opt)
        raised = None
        try:
            if misuse == "unscale_twice" or misuse == "unscale_after_step":
                self.scaler.unscale_(opt)
            elif misuse == "step_twice":
                self.scaler.step(opt)
            else:
                self.scaler.step(opt, closure=lambda: None)
        except RuntimeError as exc:
            raised = str(exc)
        assert raised is not None and messages[misuse] in raised, (  # verdict recorded by require_run
            f"{misuse}: expected RuntimeError({messages[misuse]!r}), got {raised!r}"
        )
        for other in self.opts:
            if misuse == "closure" or other is not opt or misuse == "unscale_twice":
                self.scaler.step(other)
        self.scaler.update()
        self.ref = scaling.update("torch", self.cfg, self.ref, overflowed)

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def scale_and_tracker_equal_the_reference(self) -> None:
        if not hasattr(self, "scaler"):
            return
        if self.ref.scale >= 2.0**127:
            self.counts["at_float32_top"] += 1
        got = (self.scaler.get_scale(), self.scaler._get_growth_tracker())
        want = (self.ref.scale, self.ref.growth_tracker)
        if got != want:  # verdict recorded by require_run
            raise scaling.Divergence(
                scaling.Diverged.STATE,
                f"scaler (scale, growth_tracker) = {got}, reference (torch semantics) = {want}",
            )


# -- the claims: the machine's verdicts, decided here ------------------------------------------------
def exercised_claims(counts: Mapping[str, int]) -> list[ClaimComparison]:
    """The preconditions of the rules' verdict (``counts``: what the machine's run exercised): an
    overflowing and a clean step, the top of float32, a binding clip. Each not reached is
    INCONCLUSIVE: the check was vacuous there."""
    exercised = {
        "overflow_and_clean_steps": (
            bool(counts["overflow_step"] and counts["clean_step"]),
            "the machine exercised both an overflowing and a clean step",
        ),
        "float32_top": (bool(counts["at_float32_top"]), "the machine reached the top of float32"),
        "clip_binding": (bool(counts["clip_binding"]), "a clipped step bound (coefficient < 1)"),
    }
    return [
        compare_claim(
            f"rules_run.exercised.{what}",
            held,
            held,
            criterion,
            detail=f"not exercised: the check is vacuous there {dict(counts)}",
            inconclusive=True,
        )
        for what, (held, criterion) in exercised.items()
    ]


def capped_growth_claim(got: float, expected: float, known: bool) -> ClaimComparison:
    """2^126 x 4 overflows float32: the growth is skipped (``known``: the registered uncapped
    growth applies here, so the claim is that the finding still holds)."""
    return compare_claim(
        "scale_after_capped_growth",
        got,
        got == expected,
        f"2^126 x 4 overflows float32: growth is skipped{f' (known issue {UNCAPPED.id}: inf)' if known else ''}",
        detail=f"scale {got}, expected {expected}",
        expected=expected,
        allowance=0,
        finding=known,
    )
