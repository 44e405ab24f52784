"""The distributed family's reproductions: the suite's rank programs, forked over gloo on the CPU,
against a reduction of the ranks' own gradients within its derived budget."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from harness.domains.repro import FailureRepro, ScriptTemplate
from harness.numerics.formats import format_of

#: a distributed check, standalone: ``scripts/ranks.py``
RANKS = ScriptTemplate(__package__ or "harness.domains.distributed", "ranks")

#: each check's rank program and judgement: blocks of :data:`RANKS`
_BLOCKS = {
    "ddp_compression": ("ddp", "ddp_compression"),
    "ddp_allreduce": ("ddp", "ddp_allreduce"),
    "fsdp2_reduce": ("fsdp2", "fsdp2_reduce"),
    "ddp_amp_training": ("amp_training", "amp_training_reference"),
    "sharded_scaler": ("scaler", "sharded_scaler"),
    "fsdp2_policy": ("fsdp2_policy", "fsdp2_policy_field"),
}


def distributed(
    what: str,
    check: str,
    world: int,
    specs: Mapping[str, str | None],
    fmt_name: str | None = None,
    settings: Mapping[str, object] | None = None,
) -> FailureRepro | None:
    """A distributed check as a script whose ``world`` ranks are forked from it (gloo, CPU): the
    rank program and the suite's model and inputs written out, the implementations under test by
    ``module:function`` name (``specs``: torch's own, or a module of yours the script then needs),
    the budget derived inline as the check derives it. ``check``: ``ddp_compression`` (the hooked
    path against DDP's plain all-reduce), ``ddp_allreduce`` (DDP's plain path against the exact mean
    of the ranks' own gradients), ``fsdp2_reduce`` (FSDP2's reduced gradient against that mean),
    ``sharded_scaler`` (an inf on any one rank: every rank skips, one scale), ``fsdp2_policy`` (one
    field of FSDP2's MixedPrecisionPolicy against what the modules and collectives carried;
    ``settings`` names it, ``FIELD``, and ``fmt_name`` the declared reduce dtype) (float8 all-gather is the fp8 family's:
    :func:`harness.domains.fp8.repro.float8_all_gather`)."""
    if check not in _BLOCKS:
        return None
    fmt = format_of(getattr(torch, fmt_name)) if fmt_name else None
    values = {name: repr(spec) for name, spec in specs.items()}
    values.update({name: repr(value) for name, value in (settings or {}).items()})
    values["WORLD"] = repr(world)
    if check == "ddp_compression":
        assert fmt is not None  # the compression format: unit roundoff, half its smallest subnormal
        values.update(U=repr(fmt.unit_roundoff), ETA=repr(fmt.smallest_subnormal / 2))
    if check == "fsdp2_policy":
        assert fmt is not None  # the declared reduce dtype
        values["REDUCE_DTYPE"] = f"torch.{fmt_name}"
    if check == "fsdp2_reduce":
        assert fmt is not None  # the declared reduce dtype
        values.update(
            REDUCE_DTYPE=f"torch.{fmt_name}",
            REDUCE_U=repr(fmt.unit_roundoff),
            REDUCE_ETA=repr(fmt.smallest_subnormal / 2),
            FP32_REDUCE=repr(fmt_name == "float32"),
        )
    program, judgement = _BLOCKS[check]
    code = RANKS.fill("prelude", program, "launch", judgement, "verdict", values=values)
    needs = sorted({"torch", *(s.partition(":")[0].split(".")[0] for s in specs.values() if s)})
    return FailureRepro("distributed", what, code, _DIST_ALLOWANCE[check], needs=tuple(needs))


_DIST_ALLOWANCE = {
    "ddp_compression": "the compression format's rounding and /W per rank, gamma_(W-1) of its sum, gamma_W(2^-24) of "
    "the fp32 reference",
    "ddp_allreduce": "gamma_W(2^-24) mean|g|: an fp32 reduce of W gradients",
    "fsdp2_reduce": "the declared reduce dtype's: its rounding and /W per rank and gamma_(W-1) of its sum (fp32: "
    "gamma_W(2^-24) mean|g|)",
    "sharded_scaler": "exact: a skipped step on every rank, one scale",
    "fsdp2_policy": "exact: every module and collective call carries the declared dtype",
    "ddp_amp_training": "the batch reduced in another order: gamma_(B + 4 x modules)(2^-11) sum_i |g_i| of the first "
    "step's gradients, gamma_(B x steps)(2^-11) |L| of the losses",
}
