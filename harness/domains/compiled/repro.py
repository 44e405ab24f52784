"""The compiled family's reproductions: ops' compiled output dtypes against eager's."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from harness.domains.call_capture import Captured, observed_cases
from harness.domains.compiled import probe
from harness.domains.compiled.budget import NumericsResult
from harness.domains.compiled.catalogue import CompiledOp
from harness.domains.compiled.nested import WIDTH, Region, RegionRuns, bounds_of
from harness.domains.compiled.runs import Backend, BlockRuns, Variant
from harness.domains.engines.ops.probe import replayed
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src

#: compiled AMP's claims, standalone: ``scripts/compiled.py``
COMPILED = ScriptTemplate(__package__ or "harness.domains.compiled", "compiled")


def compiled_dtypes(
    what: str, cases: Sequence[tuple[str, Captured]], device: str, dtype: torch.dtype, backend: str
) -> FailureRepro:
    """Each case's calls under autocast, eager and through ``torch.compile(backend=...)``: the
    compiled output dtype (or the error's first line) against eager's, computed beside it."""
    prelude, tensors = observed_cases(cases, ["" for _ in cases], device, dtype)
    code = COMPILED.fill("cases", "dtypes", values={"BACKEND": repr(backend)}, replace={"cases": prelude})
    return FailureRepro(
        "compiled", what, code, "exact: autocast's choice of dtype is eager's, compiled or not", tensors, device=device
    )


def block_repro_of(
    block_runs: BlockRuns, dtype: torch.dtype, result: NumericsResult, variant: Variant | None = None
) -> FailureRepro | None:
    """The standalone reproduction of a failed numerics check of the default variant (or
    ``variant``, its Inductor switches written into the script): the probe block (its source, its
    weights and inputs saved), eager and ``torch.compile`` (Inductor, what a user gets) under
    autocast, against float64, each quantity's excess over eager within the budget the harness
    derived (written into the script with its origin). None for a custom backend, or a variant
    that configures more than Inductor."""

    if block_runs.backend != "inductor" or (variant is not None and variant.functorch):
        return None
    opening, tensors = _block_script(block_runs, dtype)
    allowance = {k: result.budget.allowance[k] for k in result.compiled}
    config = dict(variant.inductor) if variant is not None else {}
    code = opening("block_numerics", {"ALLOWANCE": repr(allowance), "INDUCTOR_CONFIG": repr(config)})
    return FailureRepro(
        "compiled",
        f"torch.compile (Inductor) of the probe block under {dtype} autocast: every stage and gradient's error "
        "against float64 beyond eager's, over its budget",
        code,
        "one low-precision rounding per op boundary, propagated in float64 (harness/domains/compiled/budget.py)",
        tensors,
        device=str(block_runs.device),
    )


def block_dtypes_repro_of(block_runs: BlockRuns, dtype: torch.dtype) -> FailureRepro | None:
    """The standalone reproduction of a failed dtype check: every stage output and gradient of the
    compiled (Inductor) probe block against eager's dtype. None for a custom backend."""

    if block_runs.backend != "inductor":
        return None
    opening, tensors = _block_script(block_runs, dtype)
    code = opening("block_dtypes")
    return FailureRepro(
        "compiled",
        f"torch.compile (Inductor) of the probe block under {dtype} autocast: every stage and gradient's dtype "
        "against eager's",
        code,
        "exact: compiled AMP keeps autocast's dtypes",
        tensors,
        device=str(block_runs.device),
    )


def region_repro_of(runs: RegionRuns, dtype: torch.dtype, variant: Variant, part: str) -> FailureRepro | None:
    """The standalone reproduction of a failed region check: the region's source, weights and
    input, eager and ``torch.compile`` (Inductor, the variant's configuration in force) under
    autocast, ``part``'s dtypes against eager's and |compiled - eager| against twice the fp32
    bound the harness derived (saved with the inputs). None for a custom backend."""
    import inspect

    if runs.backend != "inductor":
        return None
    eager = runs.eager(dtype)
    bounds = {k: v for k, v in bounds_of(eager, runs.model).items() if k.startswith(part)}
    names = {k: "p_" + k.replace(".", "_") for k in runs.model.state_dict()}
    state = {names[k]: v.detach() for k, v in runs.model.state_dict().items()}
    bound_names = {k: "bound_" + k.replace(".", "_") for k in bounds}
    values = {
        "DTYPE": str(dtype),
        "BACKEND": repr("inductor"),
        "VARIANT": repr(variant.name),
        "FUNCTORCH": repr(dict(variant.functorch)),
        "INDUCTOR": repr(dict(variant.inductor)),
        "BOUNDS": "{" + ", ".join(f"{k!r}: {n}" for k, n in bound_names.items()) + "}",
    }
    model = f"WIDTH = {WIDTH}\n\n\n{inspect.getsource(Region)}"
    state_src = "STATE = {" + ", ".join(f"{k!r}: {n}" for k, n in names.items()) + "}"
    replace = {"region_model": model, "region_inputs": state_src}
    code = COMPILED.fill("region_model", "region_inputs", "region", values=values, replace=replace)
    tensors = {**state, **{bound_names[k]: v for k, v in bounds.items()}, "x": runs.x.detach()}
    return FailureRepro(
        "compiled",
        f"an autocast-disabled region inside {dtype} autocast, compiled ({variant.name}): its {part} in fp32 as eager's",
        code,
        "twice the fp32 evaluation bound of the region's matrix products (harness.numerics.budgets)",
        tensors,
        device=str(runs.x.device),
    )


def ops_repro_of(
    ops: list[CompiledOp], device: torch.device, dtype: torch.dtype, backend: Backend
) -> FailureRepro | None:
    """The standalone reproduction of a failed sweep: the ops whose compiled dtype is not eager's
    (at most ``MAX_CASES`` of :mod:`harness.domains.engines.ops.probe`), replayed from their captured
    calls, eager and compiled with the same backend. None where nothing differs, no call could be
    written, or the backend is a function of your own (the script would need your code)."""

    if not isinstance(backend, str):
        return None
    differing = (o for o in ops if o.compiled is not None and o.compiled != o.eager)
    cases = [
        (label, cap)
        for label, cap, _ in replayed(((o.name, o.name, "fp32_in", None) for o in differing), device, dtype)
    ]
    if not cases:
        return None
    return compiled_dtypes(
        f"catalogue ops whose output dtype under {device.type} autocast ({dtype}) compiled with {backend} is not "
        "eager's",
        cases,
        str(device),
        dtype,
        backend,
    )


def _block_script(block_runs: BlockRuns, dtype: torch.dtype) -> tuple[Callable[..., str], dict[str, torch.Tensor]]:
    """The probe block as a script's opening: its source, its saved weights and inputs, and
    ``eager`` and ``compiled`` (Inductor) observations of every stage and gradient under autocast;
    a function that puts a judgement after it."""
    import inspect

    state = {k: v.detach() for k, v in block_runs.model.state_dict().items()}
    names = {k: "p_" + k.replace(".", "_") for k in state}
    block = "Tap = object  # the probe's annotation: the reproduction never taps its stages\n\n\n"
    block += inspect.getsource(probe._identity) + "\n\n" + inspect.getsource(probe.Block)
    values = {
        "BLOCK_ARGS": repr((probe.WIDTH, 4, probe.CLASSES)),
        "DTYPE": str(dtype),
        "BACKEND": repr("inductor"),
    }
    state_src = "STATE = {" + ", ".join(f"{k!r}: {v}" for k, v in names.items()) + "}"

    def opening(judgement: str, more: dict[str, str] | None = None) -> str:
        blocks = ("block_model", "block_inputs", "block_opening", judgement)
        replace = {"block_model": block, "block_inputs": state_src}
        return COMPILED.fill(*blocks, values={**values, **(more or {})}, replace=replace)

    tensors = {names[k]: v for k, v in state.items()}
    tensors.update(x=block_runs.x.detach(), y=block_runs.y.detach())
    return opening, tensors


def scalar_repro(
    device: torch.device, dtype: torch.dtype, backend: Backend, cases: Sequence[str]
) -> FailureRepro | None:
    """A Python scalar meeting an autocast region's output, compiled (Inductor, as users get it):
    ``cases``' values against eager's. None for a custom backend."""
    if backend != "inductor":
        return None
    values = {"SCALAR_DTYPE": dtype_src(dtype), "SCALAR_BACKEND": repr(backend), "JUDGED": repr(list(cases))}
    return FailureRepro(
        "compiled",
        f"torch.compile (Inductor) of Python scalars meeting a {dtype} autocast output: cases whose value is not "
        "eager's",
        COMPILED.fill("scalars", values=values),
        "exact: eager's value, the same program uncompiled",
        device=device.type,
    )
