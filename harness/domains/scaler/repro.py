"""The loss-scaling family's reproductions: a scaler's trace and its state machine's rules against
the rule written out, a third-party scaler's conformance example against its release's rule, one
optimizer step under GradScaler against its float64 update or a skip, a clipped step, and the
scaler's recorded hazards and capped growth (``scripts/hazards.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from harness.domains.repro import FailureRepro, ScriptTemplate, dict_src
from harness.domains.scaler.clipping import ClipObservation
from harness.domains.scaler.optimizers import FLAGS, HYPER, ROUNDINGS, STATE_ROUNDINGS, Step

#: a scaler's scale against its rule, standalone: ``scripts/loss_scale.py``
LOSS_SCALE = ScriptTemplate(__package__ or "harness.domains.scaler", "loss_scale")
#: the scaler's recorded hazards and capped growth, standalone: ``scripts/hazards.py``
HAZARDS = ScriptTemplate(__package__ or "harness.domains.scaler", "hazards")


def _scaler_blocks(qualname: str) -> tuple[str, ...]:
    """The scaler's module, and a process group where the scaler is sharded."""
    return ("scaler_module", "group") if "Sharded" in qualname else ("scaler_module",)


def _module_of(module: str) -> dict[str, str]:
    return {"scaler_module": f"import {module}"}


def scaler_trace(
    what: str,
    scaler_cls: str,
    growth_interval: int,
    inject_at: Sequence[int],
    steps: int,
    where: str,
) -> FailureRepro | None:
    """The fp16 loss-scaler trace with overflows injected at the steps ``inject_at`` (the scaler
    suite's trainer), against the scaler's rule written out: backoff x0.5 and skip on overflow, x2
    after ``growth_interval`` clean steps. None when ``scaler_cls`` (module.qualname) cannot be
    imported standalone."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module or "<" in qualname or not (module == "torch" or module.startswith("torch.")):
        return None
    if where not in ("forward", "loss", "backward"):
        return None
    values = {
        "SCALER": scaler_cls,
        "GROWTH_INTERVAL": repr(growth_interval),
        "INJECT_AT": repr(set(inject_at)),
        "STEPS": repr(steps),
        "WHERE": repr(where),
    }
    code = LOSS_SCALE.fill(*_scaler_blocks(qualname), "trace", values=values, replace=_module_of(module))
    return FailureRepro("scaler", what, code, "exact: the trace is deterministic, the rule integral")


def hazard_repro(what: str, scaler_cls: str, hazard: str, device: str, capped: bool = True) -> FailureRepro | None:
    """One of the scaler's recorded hazards (``zero_scale``, ``tiny_scale``, ``nan_loss``) or its
    ``capped_growth`` on ``scaler_cls`` (module.qualname; None where it cannot be imported
    standalone): the script exits 1 when the finding no longer holds."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module or "<" in qualname or not (module == "torch" or module.startswith("torch.")):
        return None
    values = {"SCALER": scaler_cls, "DEVICE": repr(device), "CAPPED": repr(capped)}
    code = HAZARDS.fill(*_scaler_blocks(qualname), "parameters", hazard, values=values, replace=_module_of(module))
    allowance = "exact: the finding holds" if hazard != "capped_growth" else "exact: the rule's scale"
    return FailureRepro("scaler", what, code, allowance, device=device)


def scaler_rules(
    what: str, scaler_cls: str, transcript: Sequence[tuple[str, Mapping[str, Any]]], cap_growth: bool
) -> FailureRepro | None:
    """The GradScaler state machine's failing example, its rules replayed in order on the scaler
    suite's model, against the scaler rule written out (torch semantics, float32-faithful): after
    every rule the scale and growth tracker, and after every step with inf/NaN the parameters and
    optimizer state left bit-identical. None when ``scaler_cls`` cannot be imported standalone or
    the transcript does not start with the machine's setup."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module.startswith("torch") or "<" in qualname or not transcript or transcript[0][0] != "setup":
        return None
    rules = ",\n".join(f"    ({name!r}, {dict_src(args)})" for name, args in transcript)
    values = {"SCALER": scaler_cls, "RULES": f"[\n{rules},\n]", "CAP_GROWTH": repr(cap_growth)}
    blocks = (*_scaler_blocks(qualname), "f32", "rules")
    code = LOSS_SCALE.fill(*blocks, values=values, replace=_module_of(module))
    return FailureRepro("scaler", what, code, "exact: the rule is float32-faithful, the trace deterministic")


#: the third-party scalers' rules (as the conformance machine's specification holds them,
#: ``harness.domains.scaler.reference.update``) and the scalers as the ready adapters drive them:
#: blocks of ``scripts/loss_scale.py``
_SPEC_RULES = {"megatron": "megatron_rule", "deepspeed": "deepspeed_rule"}
_SCALER_UNDER_TEST = {"megatron-core": "megatron_core", "deepspeed": "deepspeed"}


def scaler_conformance(
    what: str, package: str, semantics: str, transcript: Sequence[tuple[str, Any]]
) -> FailureRepro | None:
    """The conformance machine's failing example against a third-party scaler (``package``: one of
    the ready adapters' packages), its iterations replayed on the scaler as the adapter drives it
    and on the ``semantics`` rule written out: after each, the scale, the growth tracker (where
    the scaler has one) and the at-minimum error compared. None for another scaler (your own
    adapter: the script would need your code) or a transcript without the machine's setup."""
    spec = _SPEC_RULES.get(semantics.split("<")[0].split(">")[0])
    under_test = _SCALER_UNDER_TEST.get(package)
    if spec is None or under_test is None or not transcript or transcript[0][0] != "setup":
        return None
    cfg = {k: v for k, v in transcript[0][1].items() if k not in ("max_scale", "cap_growth")}
    events = [bool(v) for name, v in transcript[1:] if name == "update"]
    values = {"CFG": dict_src(cfg), "EVENTS": repr(events), "SEMANTICS": repr(semantics)}
    code = LOSS_SCALE.fill("f32", "conformance_parameters", spec, under_test, "conformance", values=values)
    return FailureRepro(
        "scaler",
        what,
        code,
        f"exact: the {semantics} rule, as its source states it (the scale is a power of two times the configured "
        "factors: no rounding to allow for)",
        needs=("torch", package),
    )


# -- one optimizer step under GradScaler (the scaler suite's optimizer matrix) -------------------
#: one step under GradScaler, standalone: ``scripts/one_step.py``
ONE_STEP = ScriptTemplate(__package__ or "harness.domains.scaler", "one_step")
#: each optimizer family's float64 update: a block of :data:`ONE_STEP`
_OPTIMIZER_REFERENCES = {"SGD": "sgd", "Adam": "adam", "Adagrad": "adagrad"}


def _loaded_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    scale: float,
    device: str,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and the values that rebuild one step of a run (``load()``): the parameters,
    the optimizer's state, the scaled gradients, GradScaler's scale."""
    tensors: dict[str, torch.Tensor] = {}
    state_src = []
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        tensors[f"p{i}"], tensors[f"g{i}"] = p.detach(), g.detach()
        for key, value in state.get(i, {}).items():
            tensors[f"s{i}_{key}"] = value.detach()
        state_src.append("{" + ", ".join(f"{key!r}: s{i}_{key}" for key in state.get(i, {})) + "}")
    n = len(params)
    values = {
        "P0": f"[{', '.join(f'p{i}' for i in range(n))}]",
        "G": f"[{', '.join(f'g{i}' for i in range(n))}]",
        "STATE": f"[{', '.join(state_src)}]",
        "SCALE": repr(scale),
        "DEVICE": repr(device),
    }
    return tensors, values


def optimizer_step(
    what: str,
    name: str,
    flags: Mapping[str, bool],
    hyper: Mapping[str, Any],
    step: int,
    scale: float,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    *,
    overflow: bool,
    roundings: int,
    state_roundings: Mapping[str, int],
    device: str = "cpu",
    unit_roundoff: float = 2.0**-24,
    scaled: bool = True,
) -> FailureRepro | None:
    """One step of torch's optimizer ``name`` (``flags``: foreach, fused) stepped by GradScaler,
    from the parameters, state and scaled gradients the run had at ``step`` (saved exactly; the
    smallest faithful part of a training run). Without overflow: against the update written out in
    float64, within gamma_k(2^-24) of it evaluated on magnitudes (k: ``roundings``, the state's
    ``state_roundings``). With a planted non-finite gradient: parameters and state bitwise as they
    were, nothing created but zeros, the scale halved. ``unit_roundoff``: the parameters' format's
    (low-precision parameters); ``scaled=False``: the optimizer steps alone. None for an optimizer
    with no reference."""
    family = "Adam" if name in ("Adam", "AdamW") else name
    if family not in _OPTIMIZER_REFERENCES:
        return None
    block = _OPTIMIZER_REFERENCES[family]
    tensors, values = _loaded_step(params, grads, state, scale, device)
    # the optimizer's hyperparameters; the state of step ``step`` of the run
    values.update(OPTIMIZER=f"torch.optim.{name}", H=dict_src(dict(hyper)), FLAGS=dict_src(dict(flags)))
    if overflow:
        code = ONE_STEP.fill("parameters", "loaded", "step", "overflow", values=values)
        allowance = "exact: a skipped step changes nothing (bitwise) and halves the scale"
    else:
        reference = ONE_STEP.blocks()[block]
        used = {k: v for k, v in state_roundings.items() if f'K_STATE["{k}"]' in reference}
        values.update(K=repr(roundings), K_STATE=dict_src(used), U=repr(unit_roundoff))
        if family == "Adam":
            values["DECOUPLED"] = repr(name == "AdamW")
        stepping = "step" if scaled else "step_alone"
        code = ONE_STEP.fill("parameters", "loaded", stepping, "gamma", "roundings", block, "compare", values=values)
        allowance = (
            f"gamma_k(u = {unit_roundoff:.3g}) times the parameter and the update evaluated on magnitudes, "
            f"k = {roundings} roundings of torch's {name} formula (state: its own roundings; step counts exact)"
        )
    return FailureRepro("scaler", what, code, allowance, tensors, device=device)


def clip_step(
    what: str,
    kind: str,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    scale: float,
    max_norm: float,
    foreach: bool,
    *,
    device: str = "cpu",
) -> FailureRepro:
    """One ``unscale_`` -> ``clip_grad_norm_`` -> ``step`` of the clipping suite's SGD (momentum)
    from the saved parameters, state and scaled gradients. ``kind``: ``float64`` (the returned norm
    and the clipped gradients against clipping's definition in float64, within gamma_(n+1) and
    gamma_(n+4) of float32's unit roundoff), ``non_finite`` (a planted inf/NaN: a non-finite norm,
    the step skipped bitwise, the scale halved) or ``error_if_nonfinite`` (a non-finite norm
    raises and keeps the gradients; a finite one never raises)."""
    tensors, values = _loaded_step(params, grads, state, scale, device)
    values.update(
        OPTIMIZER="torch.optim.SGD",
        H=dict_src({"lr": 0.05, "momentum": 0.9}),
        FLAGS="{}",
        MAX_NORM=repr(max_norm),
        FOREACH=repr(foreach),
    )
    judgement = {"float64": "clip_float64", "non_finite": "clip_non_finite"}.get(kind, "clip_error")
    blocks = ("parameters", "loaded", "unscale", *(("gamma",) if kind == "float64" else ()), judgement)
    code = ONE_STEP.fill(*blocks, values=values)
    allowance = {
        "float64": "gamma_(n+1)(2^-24) of the norm; gamma_(n+4)(2^-24) |clipped| of each gradient",
        "non_finite": "exact: a non-finite norm, nothing moved, the scale halved",
    }.get(kind, "exact: a non-finite norm raises, the gradients and the step untouched; a finite one never raises")
    return FailureRepro("scaler", what, code, allowance, tensors, device=device)


def clipping_repro_of(o: ClipObservation, foreach: bool, kind: str, device: torch.device) -> FailureRepro:
    """Step ``o`` alone as a standalone script (:func:`harness.domains.scaler.repro.clip_step`)."""
    impl = "foreach" if foreach else "for-loop"
    what = {
        "float64": f"torch's {impl} unscale_ + clip_grad_norm_({o.max_norm:g}): the worst error over its float32 budget",
        "non_finite": f"torch's {impl} unscale_ + clip_grad_norm_ with {o.planted} planted: promises broken",
        "error_if_nonfinite": f"torch's {impl} clip_grad_norm_(error_if_nonfinite=True): promises broken",
    }[kind]
    return clip_step(
        what,
        kind,
        list(o.params_before),
        list(o.grads_scaled),
        o.state_before,
        o.scale_before,
        o.max_norm,
        foreach,
        device=device.type,
    )


def low_precision_repro_of(
    name: str, implementation: str, step: Step, unit_roundoff: float, scaled: bool, device: torch.device
) -> FailureRepro | None:
    """The failed ``step`` of pure low-precision training (parameters and state in bf16 or fp16,
    ``unit_roundoff`` theirs) as a standalone script: that one step, by GradScaler where ``scaled``
    or the optimizer alone, against the update in float64 within the format's roundings."""
    dtype = str(step.params_before[0].dtype).removeprefix("torch.")
    what = (
        f"torch's {implementation} {name} on {dtype} parameters"
        + (" under GradScaler" if scaled else "")
        + f", step {step.index}: |update - float64| in units of its budget"
    )
    return optimizer_repro_of(name, implementation, step, device, what, unit_roundoff=unit_roundoff, scaled=scaled)


def optimizer_repro_of(
    name: str, implementation: str, step: Step, device: torch.device, what: str | None = None, **settings: Any
) -> FailureRepro | None:
    """The failed ``step`` of a torch optimizer's run as a standalone script: that one step under
    GradScaler from the saved parameters, state and scaled gradients, against the float64 update
    (or, with overflow, against nothing moving and the scale halved); ``what`` and ``settings``
    (:func:`optimizer_step`'s ``unit_roundoff`` and ``scaled``) for a run of low-precision parameters."""
    kind = "overflow step" if step.overflow else "step"
    return optimizer_step(
        what
        or f"torch's {implementation} {name} under GradScaler, {kind} {step.index}: "
        + ("what the skipped step changed" if step.overflow else "|update - float64| in units of its budget"),
        name,
        FLAGS[implementation],
        HYPER[name],
        step.index,
        step.scale_before,
        step.params_before,
        step.grads_scaled,
        step.state_before,
        overflow=step.overflow,
        roundings=ROUNDINGS[name],
        state_roundings=STATE_ROUNDINGS,
        device=device.type,
        **settings,
    )
