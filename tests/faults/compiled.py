"""Compile-only faults: ``torch.compile`` backends that differ from a correct one in exactly one way,
handed to the compiled suite through the ``amp_compile_backend`` fixture. Eager is untouched, so
every difference the suite sees comes from the "compiler".

They are AOTAutograd backends (as Inductor is) whose graph passes rewrite the traced ATen graph
and then run it as it is (no C++ compile, so the controls stay cheap); :data:`CLEAN` is the same
backend with no pass, which must pass the same checks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from faults import fixed_in_this_release
from harness.domains.compiled.runs import LOW_PRECISION, Variant, configured, node_dtype, pass_backend, retarget

aten = torch.ops.aten


# -- a low-precision GEMM that accumulates in low precision ---------------------------------------
def _mm_low_accumulation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Products and running sums rounded to the inputs' dtype at every step (no fp32 accumulator)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for k in range(a.shape[1]):
        acc = acc + a[:, k : k + 1] * b[k : k + 1, :]
    return acc


def _addmm_low_accumulation(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **_: Any) -> torch.Tensor:
    return bias + _mm_low_accumulation(a, b)


def _bmm_low_accumulation(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack([_mm_low_accumulation(x, y) for x, y in zip(a, b, strict=True)])


def _low_accumulation(gm: torch.fx.GraphModule) -> None:
    retarget(
        gm,
        {
            aten.mm.default: _mm_low_accumulation,
            aten.addmm.default: _addmm_low_accumulation,
            aten.bmm.default: _bmm_low_accumulation,
        },
        lambda n: node_dtype(n) in LOW_PRECISION,
    )


#: A compiler whose low-precision matrix products accumulate in bf16/fp16 (forward and backward):
#: dtypes as eager, values not. Must fail the numerics check against fp64.
LOW_PRECISION_ACCUMULATION = pass_backend(_low_accumulation, _low_accumulation)


# -- autocast dropped by the compiler ------------------------------------------------------------
def _without_autocast(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """Runs Dynamo's captured graph with autocast disabled: every low-precision op in fp32."""
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)} or {"cpu"}

    def run(*args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for device in devices:
                stack.enter_context(torch.autocast(device, enabled=False))
            return gm(*args)

    return run


#: A compiler that drops autocast: the ops autocast runs in low precision run (and stay) in fp32, so
#: the compiled dtypes differ from eager's. Must fail the dtype-policy check.
AUTOCAST_DROPPED = _without_autocast


# -- a cache that serves one autocast dtype's graph to another ------------------------------------
def _as_if_cached_under_bf16(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
    """Runs Dynamo's captured graph under bf16 autocast wherever autocast is on, whatever its dtype."""
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)} or {"cpu"}

    def run(*args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            for device in devices:
                if torch.is_autocast_enabled(device):
                    stack.enter_context(torch.autocast(device, dtype=torch.bfloat16))
            return gm(*args)

    return run


#: A compiler whose cache serves the graph of the first autocast dtype it compiled (bf16) to every
#: later one: an fp16 region computes in bf16, as AOTAutograd's cache did in torch 2.11 and 2.12.
#: Must fail the registry check of that known issue in a release that fixed it (a regression).
AUTOCAST_DTYPE_CACHED = _as_if_cached_under_bf16


# -- a recomputation that drops autocast -----------------------------------------------------------
def _recompute_in_fp32(gm: torch.fx.GraphModule) -> None:
    """In the backward graph, every cast to a low-precision dtype that the partitioner placed there
    to recompute a checkpointed region casts to fp32 instead."""
    for node in gm.graph.nodes:
        if (
            node.meta.get("recompute") is not None
            and node.target is aten._to_copy.default
            and node.kwargs.get("dtype") in LOW_PRECISION
        ):
            node.kwargs = {**node.kwargs, "dtype": torch.float32}
    gm.recompile()


#: A compiler whose checkpointed regions recompute in fp32 in the backward (the fp32 recompute of
#: fairscale#1199, inside the compiled graph): the compiled checkpointing check must fail.
RECOMPUTE_IN_FP32 = pass_backend(None, _recompute_in_fp32)
CLEAN_PASSES = pass_backend(None)


def recompute_in_fp32_backend(original: object) -> object:
    """``harness.domains.patterns.checkpointing.COMPILE_BACKEND`` replaced by :data:`RECOMPUTE_IN_FP32`."""
    return RECOMPUTE_IN_FP32


def clean_passes_backend(original: object) -> object:
    """``COMPILE_BACKEND`` replaced by the pass backend with no pass (the fault's clean twin)."""
    return CLEAN_PASSES


# -- autocast leaking into a region that disabled it ---------------------------------------------
def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


def _mm_leaky(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(_rounded(a), _rounded(b))


def _addmm_leaky(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **_: Any) -> torch.Tensor:
    return torch.addmm(bias, _rounded(a), _rounded(b))


def _leaky(gm: torch.fx.GraphModule) -> None:
    retarget(
        gm, {aten.mm.default: _mm_leaky, aten.addmm.default: _addmm_leaky}, lambda n: node_dtype(n) == torch.float32
    )


#: fp32 matrix products computed from bf16-rounded inputs (dtype fp32, precision bf16): autocast
#: leaking into a region that disabled it, forward and backward. Must fail the region checks.
AUTOCAST_LEAKING_INTO_DISABLED_REGIONS = pass_backend(_leaky, _leaky)


# -- the backward traced under the forward's autocast ------------------------------------------------
def _traced_with(**config: Any) -> Any:
    inner = pass_backend(None)
    forced = Variant("forced by the backend", functorch=config)

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        with configured(forced):
            return inner(gm, example_inputs)

    return backend


#: A compiler that traces every backward under the forward's autocast, whatever it is asked: the
#: fp32 region's backward runs in low precision. Must fail the backward region check.
BACKWARD_UNDER_AUTOCAST = _traced_with(backward_pass_autocast="same_as_forward")
#: A compiler that always traces the backward outside autocast: on torch 2.13 the known issue
#: ``compiled-backward-under-forward-autocast`` is then absent, and its registry check must say
#: "appears fixed".
BACKWARD_OUTSIDE_AUTOCAST = _traced_with(backward_pass_autocast="off")


# -- overflow saturated inside the compiled step ---------------------------------------------------
def _saturate(gm: torch.fx.GraphModule) -> None:
    """Every floating output of the graph with inf/NaN replaced by its dtype's largest finite value
    (a "safe" kernel that clamps): the overflow never reaches the scaler."""
    (output,) = (n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0]
    with gm.graph.inserting_before(output):
        new = [
            gm.graph.call_function(torch.nan_to_num, (v,))
            if isinstance(v, torch.fx.Node) and (dt := node_dtype(v)) is not None and dt.is_floating_point
            else v
            for v in values
        ]
    output.args = (type(values)(new),)
    gm.recompile()


#: A compiled step whose outputs (forward and backward) saturate instead of
#: overflowing: GradScaler never sees the injected overflow. Must fail the compiled training
#: check's scaler-state comparison.
SATURATING_OVERFLOW = pass_backend(_saturate, _saturate)

#: The same AOTAutograd backend with no pass: must pass every check the faults fail.
CLEAN = pass_backend(None)


# -- Python scalars kept unrounded ---------------------------------------------------------------
#: the ops a Python scalar meets a tensor in (the traced ATen graph's packets)
_SCALAR_OPS = {aten.add, aten.sub, aten.rsub, aten.gt, aten.ge, aten.lt, aten.le, aten.eq, aten.ne, aten.fmod,
               aten.remainder}  # fmt: skip


def _in_fp32(op: Callable[..., Any]) -> Callable[..., Any]:
    """``op`` computed on fp32 copies of its low-precision tensors, the Python scalar as given, a
    floating result rounded back to the inputs' dtype: what a compiler keeping scalars unrounded in
    its fp32 compute type gives."""

    def unrounded(*args: Any, **kwargs: Any) -> Any:
        low = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.dtype in LOW_PRECISION)
        widened = [a.float() if isinstance(a, torch.Tensor) and a.dtype == low else a for a in args]
        out = op(*widened, **kwargs)
        return out.to(low) if out.dtype.is_floating_point else out

    return unrounded


def _unround_scalars(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        packet = getattr(node.target, "overloadpacket", None)
        scalar = any(isinstance(a, float) for a in node.args)
        low = any(isinstance(a, torch.fx.Node) and node_dtype(a) in LOW_PRECISION for a in node.args)
        if node.op == "call_function" and packet in _SCALAR_OPS and scalar and low:
            node.target = _in_fp32(node.target)
    gm.recompile()


#: A compiler that keeps a Python scalar unrounded where eager rounds it to the tensor's dtype
#: (comparisons, add/sub, fmod/remainder; forward and backward). Must fail every scalar case.
UNROUNDED_SCALARS = pass_backend(_unround_scalars, _unround_scalars)


# -- a machine without a compiler toolchain --------------------------------------------------------
def toolchain_missing(real: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """``harness.domains.engines.compiler.toolchain.unavailable`` on a machine without g++ (Inductor needs it)."""

    def unavailable(device_type: str) -> str | None:
        return "Inductor's CPU backend needs a C++ compiler: 'g++' (from $CXX or the default) is not on PATH"

    return unavailable


#: the catalogue ops a compiled-sweep control compiles (the whole sweep is minutes): two that autocast
#: runs in low precision and one it keeps in float32
SWEEP_SAMPLE = ("torch.mm", "F.linear", "F.layer_norm")


def catalogue_sample(catalogue: list[Any]) -> list[Any]:
    """A patch of ``harness.domains.compiled.catalogue.CATALOGUE``: :data:`SWEEP_SAMPLE` only."""
    return [c for c in catalogue if c.name in SWEEP_SAMPLE]


def _compiled_returning(transform: Callable[[Any], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A ``torch.compile`` fault: compiled functions return ``transform`` of what they computed
    (eager is untouched)."""

    def factory(real: Callable[..., Any]) -> Callable[..., Any]:
        def compile(fn: Any = None, **kwargs: Any) -> Any:
            compiled = real(fn, **kwargs)
            return lambda *args, **kw: transform(compiled(*args, **kw))

        return compile

    return factory


def _softmax_to_4_bits(out: Any) -> Any:
    if isinstance(out, dict) and "softmax" in out:
        m, e = torch.frexp(out["softmax"].detach().float())
        out = {**out, "softmax": torch.ldexp(torch.round(m * 16) / 16, e).to(out["softmax"].dtype)}
    return out


#: ``torch.compile`` returning a ``softmax`` stage kept to 4 significand bits (a compiler losing
#: precision in one stage)
compile_rounding_softmax = _compiled_returning(_softmax_to_4_bits)


def _softmax_in_float32(out: Any) -> Any:
    return {**out, "softmax": out["softmax"].float()} if isinstance(out, dict) and "softmax" in out else out


#: ``torch.compile`` returning the ``softmax`` stage in float32 where eager gives it in the
#: low-precision dtype (a compiler dropping autocast's choice for one op)
compile_softmax_in_float32 = _compiled_returning(_softmax_in_float32)


def _tensor_in_float32(out: Any) -> Any:
    return out.float() if isinstance(out, torch.Tensor) and out.is_floating_point() else out


#: ``torch.compile`` returning every floating tensor result in float32 (a compiler dropping
#: autocast's low-precision choice for every op compiled alone)
compile_outputs_in_float32 = _compiled_returning(_tensor_in_float32)


def _tensor_scaled_off(out: Any) -> Any:
    return out * (1 + 2**-4) if isinstance(out, torch.Tensor) and out.is_floating_point() else out


#: ``torch.compile`` returning a compiled model's output 1 + 2^-4 times what it computed (a constant
#: folded wrong in its 4th bit): compiled training drifts from eager (3.2x the MLP's parity
#: allowance; outputs merely rounded to 2 significand bits stay within it)
compile_output_scaled_off = _compiled_returning(_tensor_scaled_off)


def _region_out_in_low_precision(out: Any) -> Any:
    if isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out):
        return out[0], out[1].to(out[0].dtype)
    return out


#: ``torch.compile`` whose functions returning ``(h, out)`` give ``out`` in ``h``'s low-precision
#: dtype (autocast leaking into a region that disabled it)
compile_region_in_low_precision = _compiled_returning(_region_out_in_low_precision)


def compile_recomputing_in_fp32(real: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` whose partitioning backend (``aot_eager_decomp_partition``, named) is
    :data:`RECOMPUTE_IN_FP32`: checkpointed regions recompute in fp32 in the compiled backward."""

    def compile(fn: Any = None, **kwargs: Any) -> Any:
        if kwargs.get("backend") == "aot_eager_decomp_partition":
            kwargs = {**kwargs, "backend": RECOMPUTE_IN_FP32}
        return real(fn, **kwargs)

    return compile


# -- row reductions of shared logits ---------------------------------------------------------------
#: the softmax family, forward and backward (autocast keeps them in fp32 on a CPU where it does)
_SOFTMAX_OPS = {
    aten._softmax.default,
    aten._log_softmax.default,
    aten._softmax_backward_data.default,
    aten._log_softmax_backward_data.default,
    aten.logsumexp.default,
}


def _in_low_precision(op: Callable[..., Any], out_dtype: torch.dtype) -> Callable[..., Any]:
    """``op`` computed on bf16 copies of its fp32 tensors (a dtype argument too), its result in the
    dtype the graph expects: the classic AMP mistake of a reduction forced into low precision."""

    def low(*args: Any, **kwargs: Any) -> Any:
        cast = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]
        cast = [torch.bfloat16 if a is torch.float32 else a for a in cast]
        return op(*cast, **kwargs).to(out_dtype)

    return low


def _softmax_in_low_precision(gm: torch.fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _SOFTMAX_OPS:
            out = node_dtype(node)
            assert out is not None
            node.target = _in_low_precision(node.target, out)
    gm.recompile()


#: A compiler that computes softmax, log-softmax, logsumexp and their backward in bf16 (forward and
#: backward graphs). Must fail the losses-sharing-logits check on its numerics.
SOFTMAX_IN_LOW_PRECISION = pass_backend(_softmax_in_low_precision, _softmax_in_low_precision)


def _removed_buffer(gm: torch.fx.GraphModule) -> None:
    """The backward of a softmax and a log-softmax of the same logits does not compile, as torch
    2.6's Inductor stops (pytorch/pytorch#144186): an assertion naming a buffer."""
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    if {aten._softmax_backward_data.default, aten._log_softmax_backward_data.default} <= targets:
        raise AssertionError("buf0")


#: A compiler with torch 2.6's removed-buffer failure, on a release the registry does not list it
#: for: must fail the losses-sharing-logits check (it does not build) and its registry check.
REMOVED_BUFFER_ASSERTION = pass_backend(None, _removed_buffer)


class _NoRegion:
    """``torch.autocast`` as an export that lost its regions sees it: entering changes nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def export_dropping_autocast(real: Callable[..., Any]) -> Callable[..., Any]:
    """torch.export as torch 2.4's non-strict export (and 2.6/2.7's strict one) behaved: the traced
    program has none of the module's autocast regions, so it runs them in fp32."""
    import functools

    @functools.wraps(real)
    def export(*args: Any, **kwargs: Any) -> Any:
        saved = torch.autocast
        torch.autocast = _NoRegion  # type: ignore[misc, assignment]
        try:
            return real(*args, **kwargs)
        finally:
            torch.autocast = saved  # type: ignore[misc]

    return export


def export_assertion_fixed_in_this_release(original: dict[str, Any]) -> dict[str, Any]:
    """The compiled registry saying strict export's nested regions were fixed in the running release:
    on a release that still has the issue (2.5 on) the export check judges it, as without the entry."""
    from harness.domains.compiled.known_issues import EXPORT_STRICT_NESTED

    return fixed_in_this_release(original, EXPORT_STRICT_NESTED)
