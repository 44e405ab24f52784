"""GradScaler bugs, each wrong in one way. They reach the scaler suite through its public seam,
the ``scaler_factory`` fixture; the bugs themselves live inside GradScaler, so the subclasses
override the methods where such a bug would be (its update, unscale and step internals).

:class:`PyGradScaler` re-implements ``update()`` in Python with torch's semantics (and passes the
suite: the control of the controls), so that single transitions of it can be broken.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler, OptState, _refresh_per_optimizer_state
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

import faults
from harness.domains.engines.ranks.ranks import single_rank_group


def _scale(s: GradScaler) -> torch.Tensor:
    assert s._scale is not None, "scale() was never called"
    return s._scale


def _tracker(s: GradScaler) -> torch.Tensor:
    assert s._growth_tracker is not None, "scale() was never called"
    return s._growth_tracker


class PyGradScaler(GradScaler):
    """GradScaler with update() in Python (torch semantics), so single steps of it can be broken."""

    def _found_inf(self) -> bool:
        return bool(
            sum(
                float(v.item())
                for st in self._per_optimizer_states.values()
                for v in st["found_inf_per_device"].values()
            )
        )

    def _on_inf(self) -> None:
        _scale(self).mul_(self._backoff_factor)
        _tracker(self).fill_(0)

    def _on_clean(self) -> None:
        tracker = int(_tracker(self).item()) + 1
        if tracker == self._growth_interval:
            grown = _scale(self) * self._growth_factor
            if torch.isfinite(grown):
                _scale(self).copy_(grown)
            tracker = 0
        _tracker(self).fill_(tracker)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        if new_scale is not None:
            return super().update(new_scale)
        self._check_scale_growth_tracker("update")
        if self._found_inf():
            self._on_inf()
        else:
            self._on_clean()
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)  # as GradScaler.update does
        return None


class NeverBacksOff(PyGradScaler):
    def _on_inf(self) -> None:
        _tracker(self).fill_(0)


class TrackerNotResetOnInf(PyGradScaler):
    def _on_inf(self) -> None:
        _scale(self).mul_(self._backoff_factor)


class GrowsOneStepLate(PyGradScaler):
    def _on_clean(self) -> None:
        tracker = int(_tracker(self).item()) + 1
        if tracker == self._growth_interval + 1:
            _scale(self).mul_(self._growth_factor)
            tracker = 0
        _tracker(self).fill_(tracker)


class GrowthNotCapped(PyGradScaler):
    def _on_clean(self) -> None:
        tracker = int(_tracker(self).item()) + 1
        if tracker == self._growth_interval:
            _scale(self).mul_(self._growth_factor)
            tracker = 0
        _tracker(self).fill_(tracker)


class NewScaleResetsTracker(GradScaler):
    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        super().update(new_scale)
        if new_scale is not None:
            _tracker(self).fill_(0)


class OnlyFirstOptimizerCounts(PyGradScaler):
    def _found_inf(self) -> bool:
        states = list(self._per_optimizer_states.values())
        return bool(sum(float(v.item()) for v in states[0]["found_inf_per_device"].values())) if states else False


class MissesNaN(GradScaler):
    """The inf check ignores NaN (it tests isinf only)."""

    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        has_inf = any(
            bool(p.grad.isinf().any()) for g in optimizer.param_groups for p in g["params"] if p.grad is not None
        )
        out = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        for t in out.values():
            t.fill_(1.0 if has_inf else 0.0)
        return out


class StepsDespiteInf(GradScaler):
    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any], *args: Any, **kwargs: Any
    ) -> float | None:
        out: float | None = optimizer.step(*args, **kwargs)
        return out


class SkipBumpsOptimizerStep(GradScaler):
    """A skipped step still advances the optimizer's step counters (bias correction drifts)."""

    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, optimizer_state: dict[str, Any], *args: Any, **kwargs: Any
    ) -> float | None:
        if sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
            for state in optimizer.state.values():
                if "step" in state:
                    state["step"] += 1
                if "momentum_buffer" in state and state["momentum_buffer"] is not None:
                    state["momentum_buffer"].mul_(0.9)
            return None
        out: float | None = optimizer.step(*args, **kwargs)
        return out


class UnscalesTwice(GradScaler):
    """Divides the gradients by the scale twice."""

    def _unscale_grads_(
        self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool
    ) -> dict[torch.device, torch.Tensor]:
        return super()._unscale_grads_(optimizer, inv_scale * inv_scale, found_inf, allow_fp16)


class AllowsDoubleUnscale(GradScaler):
    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if self._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED:
            return None
        return super().unscale_(optimizer)


class StateDictDropsTracker(GradScaler):
    def state_dict(self) -> dict[str, Any]:
        sd = super().state_dict()
        sd["_growth_tracker"] = 0
        return sd


class BackoffFloorAtOne(PyGradScaler):
    """A 'safety' floor that is not torch's semantics: the scale never goes below 1."""

    def _on_inf(self) -> None:
        super()._on_inf()
        _scale(self).clamp_(min=1.0)


class ShardedGradScalerCappedOnCpu(ShardedGradScaler):
    """ShardedGradScaler as it would be once its CPU update caps growth like GradScaler: the
    registry's known issue 'sharded-cpu-growth-uncapped' must then say "appears fixed". Creates the
    single-rank process group it needs (the caller destroys it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        single_rank_group()
        super().__init__(*args, **kwargs)

    def _amp_update_scale_cpu_(self, found_inf: torch.Tensor) -> None:
        before = _scale(self).clone()
        super()._amp_update_scale_cpu_(found_inf)
        if not bool(torch.isfinite(_scale(self))):
            _scale(self).copy_(before)


BROKEN_SCALERS: dict[str, type[GradScaler]] = {
    c.__name__: c
    for c in (
        NeverBacksOff,
        TrackerNotResetOnInf,
        GrowsOneStepLate,
        GrowthNotCapped,
        NewScaleResetsTracker,
        OnlyFirstOptimizerCounts,
        MissesNaN,
        StepsDespiteInf,
        SkipBumpsOptimizerStep,
        UnscalesTwice,
        AllowsDoubleUnscale,
        StateDictDropsTracker,
        BackoffFloorAtOne,
    )
}


# -- optimizer implementations under GradScaler (suites/scaler/test_optimizer_implementations.py) --
def fused_ignoring_found_inf(original: Any) -> Any:
    """A fused optimizer kernel that ignores GradScaler's ``found_inf``: it steps on an overflow."""

    def broken(*args: Any, **kwargs: Any) -> Any:
        kwargs["found_inf"] = None
        return original(*args, **kwargs)

    return broken


def foreach_addcdiv_rounding_to_bf16(original: Any) -> Any:
    """``torch._foreach_addcdiv_`` whose results keep bf16's 8 bits only: the foreach Adam, AdamW
    and Adagrad parameter updates lose precision (a lossy vectorised kernel)."""

    def broken(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(tensors, *args, **kwargs)
        with torch.no_grad():
            for t in tensors:
                t.copy_(t.to(torch.bfloat16).to(t.dtype))
        return out

    return broken


def fused_adam_keeping_low_precision_params(original: Any) -> Any:
    """``torch._fused_adam_`` that steps its state but writes nothing back to bf16 or fp16
    parameters: a fused kernel's low-precision store path lost (the shape of torch 2.13's fused CPU
    SGD bug, in another optimizer)."""

    def broken(params: Any, *args: Any, **kwargs: Any) -> Any:
        low = [p for p in params if p.dtype in (torch.bfloat16, torch.float16)]
        kept = [p.detach().clone() for p in low]
        out = original(params, *args, **kwargs)
        with torch.no_grad():
            for p, before in zip(low, kept, strict=True):
                p.copy_(before)
        return out

    return broken


def fused_sgd_low_precision_fixed_in_this_release(original: Any) -> Any:
    """A registry that says fused CPU SGD's low-precision bug was fixed in the running release: on
    a release that still has it (2.4 to 2.13) the low-precision check judges it, as it would
    without the entry."""
    return faults.fixed_in_this_release(original, "fused-sgd-cpu-skips-low-precision-vector-blocks")


def never_present(original: Any) -> Any:
    """An observation of a known issue that never finds it: a release that fixed it."""

    def fixed(*args: Any, **kwargs: Any) -> bool:
        return False

    return fixed


def _registry_with(original: Any, issue_id: str, **changes: Any) -> Any:
    """The scaling registry with one entry's lifecycle changed (a dict copy: the module's stays)."""
    import dataclasses

    return {**original, issue_id: dataclasses.replace(original[issue_id], **changes)}


def fixed_in_this_release(original: Any) -> Any:
    """A registry that says update(int) was fixed in the running torch release: the bug the stack
    still has then reads as a fixed issue that came back."""
    return faults.fixed_in_this_release(original, "update-int-new-scale")


def verified_long_ago(original: Any) -> Any:
    """A registry whose update(int) entry was last verified on a release older than the running
    one: the running release is newer than any it lists."""
    return _registry_with(original, "update-int-new-scale", first="2.0", verified="2.0", fixed=None)


class GrowsEveryOtherStep(torch.amp.GradScaler):
    """torch's GradScaler growing its scale every 2 clean steps (from 2^8): a run's scale moves
    early, so a scaler restored wrongly after a restart shows in the scale it steps with."""

    def __init__(self, device: str = "cpu") -> None:
        super().__init__(device, init_scale=2.0**8, growth_interval=2)


class StateNotRestored(GrowsEveryOtherStep):
    """A scaler whose ``load_state_dict`` restores nothing: resumed, it starts again at 2^8."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None


def update_never_backing_off(real: Callable[..., None]) -> Callable[..., None]:
    """``GradScaler.update`` that keeps the scale where an overflow should halve it."""

    def update(self: Any, new_scale: Any = None) -> None:
        before = None if new_scale is not None or self._scale is None else self._scale.clone()
        real(self, new_scale)
        if before is not None:
            self._scale.copy_(torch.maximum(self._scale, before))

    return update


def scale_a_quarter_high(real: Callable[..., Any]) -> Callable[..., Any]:
    """``GradScaler.scale`` multiplying the loss by 1.25 x the scale ``unscale_`` divides by: every
    fp16 + GradScaler step is a quarter too long (the MLP's parity: 13x its allowance)."""

    def scale(self: Any, outputs: Any) -> Any:
        return real(self, outputs) * 1.25

    return scale


def scaler_stepping_on_overflow(real: Callable[..., Any]) -> Callable[..., Any]:
    """``GradScaler._maybe_opt_step`` stepping whatever ``found_inf`` says: an overflow step moves
    the parameters (a for-loop or foreach optimizer's skip is this method's)."""

    def _maybe_opt_step(self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any) -> Any:
        return optimizer.step(*args, **kwargs)

    return _maybe_opt_step


def _clip_by(params: list[Any], max_norm: float, norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_'s last part: every gradient times min(1, max_norm / (norm + 1e-6))."""
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for p in params:
        p.grad.mul_(coef)
    return norm


def clip_grad_norm_in_bf16(original: Any) -> Any:
    """``clip_grad_norm_`` whose total norm is accumulated in bf16 (a lossy reduction): its
    coefficient, and so every clipped gradient, is off by up to bf16's rounding. It honours
    ``error_if_nonfinite``: the fault is the reduction's precision and nothing else."""

    def lossy(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        params = [p for p in parameters if p.grad is not None]
        norm: torch.Tensor = torch.stack([p.grad.to(torch.bfloat16).float().norm() for p in params]).norm()
        if kwargs.get("error_if_nonfinite") and not bool(norm.isfinite()):
            raise RuntimeError("The total norm is non-finite, so it cannot be clipped.")
        return _clip_by(params, max_norm, norm)

    return lossy


def clip_norm_sentinel(original: Any) -> Any:
    """``clip_grad_norm_`` that turns a non-finite total norm into a -1 sentinel (the bug
    DeepSpeed's bf16 gradient-norm guard pins): the coefficient max_norm / (-1 + eps) is negative
    and flips every gradient's sign; a finite norm is reported where the step overflowed."""

    def sentinel(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        params = [p for p in parameters if p.grad is not None]
        norm: torch.Tensor = torch.stack([p.grad.detach().float().norm() for p in params]).norm()
        if not bool(norm.isfinite()):
            if kwargs.get("error_if_nonfinite"):
                raise RuntimeError("The total norm is non-finite, so it cannot be clipped.")
            norm = torch.tensor(-1.0)
        return _clip_by(params, max_norm, norm)

    return sentinel


def clip_ignoring_error_if_nonfinite(original: Any) -> Any:
    """``clip_grad_norm_`` that drops ``error_if_nonfinite``: a non-finite norm is clipped (every
    gradient turned NaN) instead of raising."""

    def ignoring(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs.pop("error_if_nonfinite", None)
        out: torch.Tensor = original(parameters, max_norm, *args, **kwargs)
        return out

    return ignoring


def sgd_without_weight_decay(real: Callable[..., None]) -> Callable[..., None]:
    """torch's functional ``sgd`` (what ``SGD.step`` calls, every implementation) dropping the
    weight decay it was given: each step misses ``lr * weight_decay * p``."""

    def sgd(*args: Any, **kwargs: Any) -> None:
        real(*args, **{**kwargs, "weight_decay": 0.0})

    return sgd


def foreach_unscale_resetting_found_inf(real: Callable[..., None]) -> Callable[..., None]:
    """torch's ``_amp_foreach_non_finite_check_and_unscale_`` clearing ``found_inf`` before it checks
    its group: GradScaler calls it once per (device, dtype) group with one ``found_inf``, so a finite
    group checked after a non-finite one erases the finding (the shape of a real host-staged kernel's
    bug, flagos-ai/Torch-FL#235) and the step is taken on inf."""

    def check(grads: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor) -> None:
        found_inf.zero_()
        real(grads, found_inf, inv_scale)

    return check


def sgd_skipping_low_precision_parameters(real: Callable[..., None]) -> Callable[..., None]:
    """torch's functional ``sgd`` (every implementation) doing nothing when its parameters are bf16
    or fp16, as torch 2.13's fused CPU SGD did to their whole vector blocks: they never train and
    no momentum buffer is kept."""

    def sgd(params: list[torch.Tensor], *args: Any, **kwargs: Any) -> None:
        if params and all(p.dtype in (torch.bfloat16, torch.float16) for p in params):
            return
        real(params, *args, **kwargs)

    return sgd


def _update_keeping(scale: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A factory: a third-party scaler's update(found_inf) that keeps the attribute ``scale`` where
    an overflow lowers it."""

    def factory(real: Callable[..., None]) -> Callable[..., None]:
        def update(self: Any, found_inf: bool) -> None:
            before = getattr(self, scale)
            real(self, found_inf)
            if found_inf:
                setattr(self, scale, before)

        return update

    return factory


#: megatron-core's ``DynamicGradScaler.update`` and DeepSpeed's ``DynamicLossScaler.update_scale``
#: never backing off
megatron_update_never_backing_off = _update_keeping("_scale")


deepspeed_update_never_backing_off = _update_keeping("cur_scale")


def fp16_clip_overflow_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The scaler registry saying the float16 clipping overflow was fixed in the running release:
    on a release that has it the low-precision clipping check judges it."""
    from harness.domains.scaler.known_issues import CLIP_FP16_OVERFLOW

    return faults.fixed_in_this_release(original, CLIP_FP16_OVERFLOW)
