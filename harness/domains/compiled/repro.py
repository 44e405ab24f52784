"""The compiled family's reproductions: ops' compiled output dtypes against eager's."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.domains.autocast.repro import replayed
from harness.domains.call_capture import Captured, observed_cases
from harness.domains.compiled import probe
from harness.domains.compiled.budget import NumericsResult
from harness.domains.compiled.catalogue import CompiledOp
from harness.domains.compiled.nested import WIDTH, Region, RegionRuns, bounds_of
from harness.domains.compiled.runs import Backend, BlockRuns, Variant
from harness.domains.repro import FailureRepro


def compiled_dtypes(
    what: str, cases: Sequence[tuple[str, Captured]], device: str, dtype: torch.dtype, backend: str
) -> FailureRepro:
    """Each case's calls under autocast, eager and through ``torch.compile(backend=...)``: the
    compiled output dtype (or the error's first line) against eager's, computed beside it."""
    prelude, tensors = observed_cases(cases, ["" for _ in cases], device, dtype)
    code = f"""{prelude}
measured = 0
for label, run, inputs in CASES:
    eager = observe(run, inputs)  # reference: the same calls, eager, under the same autocast
    torch._dynamo.reset()  # each op compiled on its own, as the check compiles it
    compiled = observe(torch.compile(run, backend={backend!r}), inputs)
    print(f"{{label}}: compiled {{compiled}}, eager {{eager}}" + ("" if compiled == eager else "   <- differs"))
    measured += compiled != eager  # ops whose compiled output dtype is not eager's
allowed = 0"""
    return FailureRepro(
        "compiled", what, code, "exact: autocast's choice of dtype is eager's, compiled or not", tensors, device=device
    )


def block_repro_of(block_runs: BlockRuns, dtype: torch.dtype, result: NumericsResult) -> FailureRepro | None:
    """The standalone reproduction of a failed numerics check of the default variant: the probe
    block (its source, its weights and inputs saved), eager and ``torch.compile`` (Inductor, what a
    user gets) under autocast, against float64, each quantity's excess over eager within the budget
    the harness derived (written into the script with its origin). None for a custom backend."""

    if block_runs.backend != "inductor":
        return None
    opening, tensors = _block_script(block_runs, dtype)
    allowance = {k: result.budget.allowance[k] for k in result.compiled}
    code = f"""{opening}ref = observe(call_block, copy.deepcopy(model).double(), x.double(), y, None)  # the float64 reference


def error(v, k):  # max |v - fp64| / max |fp64|
    scale = float(ref[k].abs().max())
    diff = float((v.double() - ref[k]).abs().max())
    return diff / scale if scale > 0 else diff


# per quantity, relative to max |fp64|: one low-precision rounding at each op boundary, propagated
# through the block in float64 (amp-harness derives it from the format's unit roundoff)
ALLOWANCE = {allowance!r}
ratios = {{k: (error(compiled[k], k) - error(eager[k], k)) / a for k, a in ALLOWANCE.items()}}
worst = max(ratios, key=lambda k: ratios[k])
for k in sorted(ratios, key=lambda k: -ratios[k])[:4]:
    print(f"{{k}}: compiled error {{error(compiled[k], k):.3g}}, eager {{error(eager[k], k):.3g}}, ({{ratios[k]:.3g}}x its budget)")
measured = ratios[worst]  # the worst quantity's excess over eager, in units of its budget
allowed = 1.0"""
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
    code = f"""{opening}
# reference: eager's dtypes (autocast's policy, as eager applies it)
differ = [k for k in eager if k not in compiled or compiled[k].dtype != eager[k].dtype]
for k in differ:
    print(f"{{k}}: compiled {{compiled[k].dtype if k in compiled else 'missing'}}, eager {{eager[k].dtype}}")
measured = len(differ)  # stages and gradients whose dtype differs from eager's
allowed = 0"""
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
    config = f"torch._functorch.config.patch({dict(variant.functorch)!r}), torch._inductor.config.patch({dict(variant.inductor)!r})"
    code = f"""import torch._functorch.config
import torch._inductor.config
from torch import nn

WIDTH = {WIDTH}


{inspect.getsource(Region)}

model = Region().to(x.device)
model.load_state_dict({{{", ".join(f"{k!r}: {n}" for k, n in names.items())}}})


def call_region(m, x):
    return m(x)


def run(fn):  # forward under autocast, backward of out.sum() outside it
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype={dtype}):
        h, out = fn(model, x)
    out.float().sum().backward()
    found = {{"forward.out": out.detach()}}
    found.update({{f"grad.{{n}}": p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}})
    return found


eager = run(call_region)
torch._dynamo.reset()
with {config}:  # the compile's configuration ({variant.name})
    compiled = run(torch.compile(call_region))
# reference: eager (the region in fp32); each of eager and compiled is within one fp32 evaluation
# bound of the exact products of the same inputs, so they differ by at most twice that bound
BOUNDS = {{{", ".join(f"{k!r}: {n}" for k, n in bound_names.items())}}}
measured = 0.0
for k, bound in BOUNDS.items():
    if compiled[k].dtype != eager[k].dtype:
        print(f"{{k}}: compiled {{compiled[k].dtype}}, eager {{eager[k].dtype}}")
        measured = math.inf
    ratio = float(((compiled[k].double() - eager[k].double()).abs() / (2 * bound)).max())
    print(f"{{k}}: |compiled - eager| is {{ratio:.3g}}x twice the fp32 bound")
    measured = max(measured, ratio)  # the worst, in units of its allowance (a dtype change: inf)
allowed = 1.0"""
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
    (at most ``MAX_CASES`` of :mod:`harness.domains.autocast.repro`), replayed from their captured
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


def _block_script(block_runs: BlockRuns, dtype: torch.dtype) -> tuple[str, dict[str, torch.Tensor]]:
    """The probe block as a script's opening: its source, its saved weights and inputs, and
    ``eager`` and ``compiled`` (Inductor) observations of every stage and gradient under autocast."""
    import inspect

    state = {k: v.detach() for k, v in block_runs.model.state_dict().items()}
    names = {k: "p_" + k.replace(".", "_") for k in state}
    block = inspect.getsource(probe._identity) + "\n\n" + inspect.getsource(probe.Block)
    code = f"""import copy

from torch import nn

Tap = object  # the probe's annotation: the reproduction never taps its stages


{block}

model = Block({probe.WIDTH}, 4, {probe.CLASSES}).to(x.device)
model.load_state_dict({{{", ".join(f"{k!r}: {v}" for k, v in names.items())}}})
DTYPE = {dtype}


def call_block(m, x, y):
    return m(x, y)


def observe(fn, m, x, y, dtype):  # forward under autocast, backward outside it (as the docs say)
    m.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = fn(m, x, y)
    out["loss"].backward()
    found = {{f"forward.{{k}}": v.detach() for k, v in out.items()}}
    found.update({{f"grad.{{n}}": p.grad.detach() for n, p in m.named_parameters() if p.grad is not None}})
    found["grad.input"] = x.grad.detach()
    return found


eager = observe(call_block, model, x, y, DTYPE)
torch._dynamo.reset()
compiled = observe(torch.compile(call_block), model, x, y, DTYPE)
"""
    tensors = {names[k]: v for k, v in state.items()}
    tensors.update(x=block_runs.x.detach(), y=block_runs.y.detach())
    return code, tensors
