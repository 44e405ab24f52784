"""Faults of the AMP-patterns suite: checkpointing that recomputes outside autocast, and custom
function decorators that do not keep their promises. Each is a factory ``fault(original)``
returning the broken replacement (``tests/helpers.py: inject(..., patches=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from faults import fixed_in_this_release


def recompute_outside_autocast(original: Any) -> Any:
    """``torch.utils.checkpoint.checkpoint`` whose recomputation (every call of the checkpointed
    function after the first) runs with autocast disabled: the fp32 recompute of fairscale#1199."""

    def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        calls = [0]

        def run(*inner: Any, **inner_kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1:
                return function(*inner, **inner_kw)
            with torch.autocast("cpu", enabled=False):
                return function(*inner, **inner_kw)

        return original(run, *args, **kwargs)

    return checkpoint


def custom_fwd_ignoring_cast_inputs(original: Any) -> Any:
    """``torch.amp.custom_fwd`` that drops ``cast_inputs``: an fp32-only kernel gets the caller's
    low-precision inputs and autocast."""

    def custom_fwd(fwd: Any = None, *, device_type: str, cast_inputs: Any = None) -> Any:
        return original(fwd, device_type=device_type)

    return custom_fwd


def custom_bwd_without_autocast(original: Any) -> Any:
    """``torch.amp.custom_bwd`` that runs the backward without the forward's autocast state."""

    def custom_bwd(bwd: Any = None, *, device_type: str) -> Any:
        return (lambda f: f) if bwd is None else bwd

    return custom_bwd


def scaler_state_not_restored(original: Any) -> Any:
    """``GradScaler.load_state_dict`` that restores nothing: the resumed scaler starts again at its
    initial scale."""

    def load_state_dict(self: Any, state_dict: Any) -> None:
        return None

    return load_state_dict


def update_per_optimizer(original: Any) -> Any:
    """``GradScaler.step`` that also updates the scale after each optimizer: two optimizers back
    the scale off twice (or the final ``update`` finds nothing recorded)."""

    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, optimizer, *args, **kwargs)
        self.update()
        return out

    return step


def penalty_left_scaled(original: Any) -> Any:
    """The examples' unscaling by hand forgotten: the penalty is taken of the *scaled* gradients."""

    def unscale_by_hand(scaled: tuple[torch.Tensor, ...], scale: float) -> list[torch.Tensor]:
        return list(scaled)

    return unscale_by_hand


def penalty_in_half(original: Any) -> Any:
    """The penalty's squares summed in fp16 (the gradients cast down first), not in fp32."""

    def penalty_of(grads: list[torch.Tensor]) -> torch.Tensor:
        result: torch.Tensor = original([g.half() for g in grads]).float()
        return result

    return penalty_of


def rescaled_mid_batch(original: Any) -> Any:
    """An effective batch whose scale is changed (doubled, as a growth would) after its second
    micro-batch: the gradients add up under two scales."""

    def accumulate(model: Any, scaler: Any, batches: Any, device: Any, dtype: Any) -> list[float]:
        first: list[float] = original(model, scaler, batches[:2], device, dtype)
        scaler.update(scaler.get_scale() * 2.0)
        rest: list[float] = original(model, scaler, batches[2:], device, dtype)
        return first + rest

    return accumulate


def step_every_micro_batch(original: Any) -> Any:
    """No accumulation: step and update after every micro-batch, as if each were the effective batch."""

    def accumulate(model: Any, scaler: Any, batches: Any, device: Any, dtype: Any) -> list[float]:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scales: list[float] = []
        for batch in batches[:-1]:
            scales += original(model, scaler, [batch], device, dtype)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        last: list[float] = original(model, scaler, batches[-1:], device, dtype)
        return scales + last

    return accumulate


def nondeterministic(original: Callable[..., Any]) -> Callable[..., Any]:
    """A kernel that is not deterministic (atomics, a split reduction racing): its output moves by
    one ulp in a random half of its elements, differently on every call and independent of
    torch's seed, as an atomic-add reduction's order moves with the scheduling."""
    import random

    draw = random.Random()  # seeded from the OS: not reset by torch.manual_seed

    # run as it is under torch.compile too (Dynamo cannot trace a generator seeded from Python):
    # a compiled graph calls it as the kernel it stands for
    @torch._dynamo.disable  # type: ignore[untyped-decorator]
    def nudge(out: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(draw.getrandbits(63))
        mask = (torch.rand(out.shape, generator=g) < 0.5).to(out.device)
        return torch.where(mask, torch.nextafter(out, torch.full_like(out, torch.inf)), out)

    def moving(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        return out + (nudge(out.detach()) - out.detach())

    return moving


def setup_context_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The setup_context custom-function issue listed as fixed in the running release."""
    from harness.domains.patterns.known_issues import SETUP_CONTEXT

    return fixed_in_this_release(original, SETUP_CONTEXT)


def shared_layer_issues_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """SAC's missed cast of a shared layer and ``checkpoint_sequential``'s dropped repeat, listed as
    fixed in the running release."""
    from harness.domains.patterns.known_issues import SELECTIVE_SHARED, SEQUENTIAL_REPEATS

    return fixed_in_this_release(original, SELECTIVE_SHARED, SEQUENTIAL_REPEATS)
