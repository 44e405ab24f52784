"""The AMP patterns family: the shapes of a training step PyTorch's "Automatic Mixed Precision
examples" document beyond the plain one (activation checkpointing, custom autograd functions, ...),
each run in its documented form and held to a reference that does not use the path under test.

Bit for bit is the rule where the reference is repeatable: run twice, it gives the same bits (the
CPU's kernels; a GPU's where the kernels it picks for the pattern are deterministic, as cuBLAS's are
on one stream). Where it is not, no bitwise verdict is possible either way: :func:`repeated`
measures that on the device at hand instead of assuming it of a device type."""

from __future__ import annotations

from collections.abc import Sequence

from harness.domains.engines.state import repeated as repeated
from harness.numerics.comparison import ClaimComparison, compare_claim

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY: tuple[str, ...] = ()
#: why this family does not decide exactly one capability of its own
CAPABILITY_NOTE = "a pattern is a shape of a training step, not a question of its own: each pattern suite file decides the capability of the claim it tests (loss scaling for accumulation, training parity for checkpointing and resume, distributed for their DDP and FSDP2 cells, autocast policy for custom functions)"

#: Why the Inductor checkpointing cell stays on the CPU: it compares two different compiled graphs,
#: whose fusions a GPU backend may round differently without either being wrong; a budget for that
#: has not been derived. On a GPU the partitioned cell judges the compiler's recomputation instead.
COMPILED_CPU_ONLY = (
    "bit for bit between two Inductor-compiled graphs holds where their fusions round alike, shown on the CPU; "
    "a GPU cell of generated code needs a budget for differently fused graphs (not derived yet): here the "
    "partitioned cell judges the compiler's recomputation on eager kernels"
)


def problems_claim(name: str, problems: Sequence[str], criterion: str, context: str = "") -> ClaimComparison:
    """A pattern's promises as one claim: the broken ones counted (none may be), each named in the
    detail after ``context`` (where and how the pattern ran)."""
    joined = "; ".join(problems)
    return compare_claim(
        name,
        len(problems),
        not problems,
        criterion,
        detail=f"{context}: {joined}" if context else joined,
        expected=0,
        allowance=0,
        unit="problems",
    )


def skipped_and_halved(touched: bool, scale_before: float, scale_after: float) -> list[str]:
    """What an overflowing step broke of GradScaler's promise: nothing moved (``touched``: the step
    changed parameters or optimizer state), the scale halved once."""
    problems = ["the step changed parameters or optimizer state"] if touched else []
    if scale_after != scale_before * 0.5:
        problems.append(f"scale {scale_before} -> {scale_after}, expected x0.5")
    return problems
