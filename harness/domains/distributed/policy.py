"""Declared vs observed mixed-precision policy: what a data-parallel wrapper promises and what its
collectives and modules actually carry.

FSDP2's ``MixedPrecisionPolicy`` declares four things: the dtype modules compute in
(``param_dtype``: also what the all-gather carries), the dtype gradients are reduced in
(``reduce_dtype``: what the reduce-scatter carries), the dtype of the root's output
(``output_dtype``) and whether floating forward inputs are cast to ``param_dtype``
(``cast_forward_inputs``). A DDP communication hook declares the dtype its all-reduce carries.
Upstream has shipped a declared reduce dtype silently not applied to one collective, so each
field is observed, not assumed: the ``torch.distributed`` collectives are wrapped while the ranks
run (recording the dtype each carries), and hooks on every module record the dtypes it computes
in, receives and returns. :func:`compare` turns declaration and observation into one finding per
field and collective; an observation that saw nothing is a finding too (the wrapper no longer sees
the path a release takes), never a pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.numerics.comparison import ClaimComparison, compare_claim

#: The torch.distributed collectives observed (those a wrapper may call to move gradients or
#: parameters); each records the dtypes of the tensors it carries.
COLLECTIVES = (
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
)
#: Which observed collectives carry which declared field.
GATHERS = ("all_gather_single", "all_gather_into_tensor", "all_gather")
REDUCES = ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter", "all_reduce")


@dataclass
class Observed:
    """What the ranks saw: per collective the dtypes carried (in call order), per module the
    dtypes of its parameters at forward time, its floating inputs and its outputs."""

    collectives: dict[str, list[str]] = field(default_factory=dict)
    params: dict[str, list[str]] = field(default_factory=dict)
    inputs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"collectives": self.collectives, "params": self.params, "inputs": self.inputs, "outputs": self.outputs}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Observed:
        return cls(dict(d["collectives"]), dict(d["params"]), dict(d["inputs"]), dict(d["outputs"]))


def _dtypes(obj: Any) -> list[str]:
    """The dtypes of the floating tensors in ``obj`` (tensors, lists, tuples, dicts)."""
    if isinstance(obj, torch.Tensor):
        t = getattr(obj, "_local_tensor", obj)
        return [str(t.dtype).removeprefix("torch.")] if t.is_floating_point() else []
    if isinstance(obj, (list, tuple)):
        return [d for x in obj for d in _dtypes(x)]
    if isinstance(obj, dict):
        return [d for x in obj.values() for d in _dtypes(x)]
    return []


@contextlib.contextmanager
def observe_collectives(observed: Observed) -> Iterator[None]:
    """Wrap the ``torch.distributed`` collectives of :data:`COLLECTIVES` (looked up at call time
    by the wrappers) so that each call records the dtypes it carries."""
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def wrap(name: str, original: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            carried = sorted(set(_dtypes(list(args) + list(kwargs.values()))))
            observed.collectives.setdefault(name, []).append("+".join(carried))
            return original(*args, **kwargs)

        return recorded

    try:
        for name, original in originals.items():
            setattr(dist, name, wrap(name, original))
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def observe_modules(model: torch.nn.Module, observed: Observed) -> list[Any]:
    """Hooks on every module with parameters of its own and on the root, registered after the
    wrapper's own (they see what the module computes with): parameter, input and output dtypes.
    Returns the handles."""
    handles = []
    for name, module in model.named_modules():
        label = name or "<root>"
        own = list(module.parameters(recurse=False))
        if not own and name:
            continue

        def pre(m: torch.nn.Module, args: Any, kwargs: Any, label: str = label) -> None:
            observed.inputs.setdefault(label, []).extend(_dtypes((args, kwargs)))
            observed.params.setdefault(label, []).extend(_dtypes(list(m.parameters(recurse=False))))

        def post(m: torch.nn.Module, args: Any, out: Any, label: str = label) -> None:
            observed.outputs.setdefault(label, []).extend(_dtypes(out))

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post))
    return handles


@dataclass(frozen=True)
class Finding:
    """One declared field (``field``, or ``field.collective`` for what a collective carries)
    against what was observed: ``mismatches`` names each module or collective call that differed;
    ``seen`` counts the observations."""

    field: str
    declared: str
    observed: tuple[str, ...]
    mismatches: tuple[str, ...]
    seen: int

    @property
    def holds(self) -> bool:
        return self.seen > 0 and not self.mismatches


def _finding(name: str, declared: str, per_site: Mapping[str, Sequence[str]]) -> Finding:
    seen = sum(len(v) for v in per_site.values())
    mismatches = tuple(
        f"{site}: {', '.join(sorted(set(dtypes)))}"
        for site, dtypes in per_site.items()
        if any(d != declared for d in dtypes)
    )
    observed = tuple(sorted({d for v in per_site.values() for d in v}))
    return Finding(name, declared, observed, mismatches, seen)


def compare_fsdp2(
    observed: Observed,
    param_dtype: str,
    reduce_dtype: str,
    output_dtype: str,
    cast_forward_inputs: bool,
    root: str = "<root>",
) -> list[Finding]:
    """FSDP2's four policy fields and its two collectives, each against what was observed.

    param_dtype: every module computes with parameters of that dtype; the all-gathers carry it.
    reduce_dtype: the reduce-scatters (and any all-reduce) carry it. output_dtype (declared on the
    root): the root returns it. cast_forward_inputs: with it, every module's floating inputs arrive
    in param_dtype (the root's included; without it, the root's arrive as given)."""
    modules = {k: v for k, v in observed.params.items() if k != root or v}
    gathers = {f"{c} call {i}": [d] for c in GATHERS for i, d in enumerate(observed.collectives.get(c, []))}
    reduces = {f"{c} call {i}": [d] for c in REDUCES for i, d in enumerate(observed.collectives.get(c, []))}
    inputs = observed.inputs if cast_forward_inputs else {k: v for k, v in observed.inputs.items() if k != root}
    return [
        _finding("param_dtype", param_dtype, modules),
        _finding("param_dtype.all_gather", param_dtype, gathers),
        _finding("reduce_dtype.reduce_scatter", reduce_dtype, reduces),
        _finding("output_dtype", output_dtype, {root: observed.outputs.get(root, [])}),
        _finding("cast_forward_inputs", param_dtype, inputs),
    ]


def compare_hook(observed: Observed, declared: str) -> Finding:
    """A DDP communication hook's all-reduce against the dtype the hook declares."""
    calls = {f"all_reduce call {i}": [d] for i, d in enumerate(observed.collectives.get("all_reduce", []))}
    return _finding("all_reduce", declared, calls)


# -- the claims: declaration against observation, decided here ---------------------------------------
def hook_claim(prefix: str, findings: Sequence[Finding], declared: str) -> ClaimComparison:
    """Every rank's all-reduce carried the dtype its DDP hook declares (``findings``: one
    :func:`compare_hook` per rank)."""
    bad = [
        f"rank {rank}: {', '.join(f.mismatches) or 'no all_reduce observed'}"
        for rank, f in enumerate(findings)
        if not f.holds
    ]
    return compare_claim(
        f"{prefix}.declared_vs_observed.all_reduce",
        len(bad),
        not bad,
        f"every all_reduce the hook makes carries its declared dtype {declared}",
        detail=bad,
        expected=0,
        allowance=0,
        unit="ranks",
    )


def fsdp2_field_claim(reduce_dtype: str, per_rank: Sequence[Finding]) -> ClaimComparison:
    """One field of FSDP2's policy (``per_rank``: the same field's finding on every rank) carried by
    every module and collective call observed; a field observed nowhere is a mismatch too."""
    f = per_rank[0]
    bad = [
        f"rank {rank}: {m}"
        for rank, g in enumerate(per_rank)
        for m in (g.mismatches or (() if g.seen else ("nothing observed: the observer misses this path",)))
    ]
    return compare_claim(
        f"fsdp2.reduce_{reduce_dtype}.declared_vs_observed.{f.field}",
        len(bad),
        not bad,
        f"FSDP2 MixedPrecisionPolicy {f.field}: declared {f.declared}; every module and collective call "
        "observed on every rank carries it",
        detail=bad,
        expected=0,
        allowance=0,
        unit="mismatches",
    )
