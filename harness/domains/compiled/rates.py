"""The error rates of the compiled numerics rule, measured: how often it fails a clean compile
(over block initialisations and inputs), and the smallest real fault it still catches.

The fault is a compiler that rounds every low-precision matrix product's output once more, to
``bits`` significand bits (bf16 keeps 8, fp16 11): an extra rounding of relative size up to
2^-bits, of the kind a lowering that re-quantises an intermediate would add. ``bits`` at or above
the format's own precision changes nothing; each bit fewer doubles the fault.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from harness.domains.compiled import budget
from harness.domains.compiled.runs import LOW_PRECISION, Backend, BlockRuns, node_dtype, pass_backend, retarget


def round_to_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x`` rounded (to nearest) to ``bits`` significand bits, kept in its dtype."""
    mantissa, exponent = torch.frexp(x.float())
    scale = float(2**bits)
    return torch.ldexp(torch.round(mantissa * scale) / scale, exponent).to(x.dtype)


def extra_rounding_backend(bits: int) -> Any:
    """A compiler (forward and backward graphs run as traced) whose low-precision ``mm``/``addmm``/
    ``bmm`` outputs are rounded again to ``bits`` significand bits."""
    aten = torch.ops.aten

    def rounded(op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            return round_to_bits(op(*args, **kwargs), bits)

        return run

    def extra_rounding(gm: torch.fx.GraphModule) -> None:
        ops = (aten.mm.default, aten.addmm.default, aten.bmm.default)
        retarget(gm, {op: rounded(op) for op in ops}, lambda n: node_dtype(n) in LOW_PRECISION)

    return pass_backend(extra_rounding, extra_rounding)


@dataclass(frozen=True)
class RuleRun:
    seed: int
    #: the worst quantity's share of its budget (> 1 fails)
    worst_ratio: float
    worst: str


def judge_seed(backend: Backend, device: torch.device, dtype: torch.dtype, seed: int) -> RuleRun:
    """The numerics rule on the block initialised and fed with ``seed``, compiled with ``backend``."""
    block = BlockRuns(device, backend, seed)
    ref, bud = block.reference(dtype)
    result = budget.judge("rate", block.eager(dtype), block.compiled(dtype).observation, ref, bud)
    worst = result.worst()
    return RuleRun(seed, result.ratio(worst), worst)


def false_alarms(backend: Backend, device: torch.device, dtype: torch.dtype, seeds: Sequence[int]) -> list[RuleRun]:
    return [judge_seed(backend, device, dtype, s) for s in seeds]


def detection(
    device: torch.device, dtype: torch.dtype, bits: Sequence[int], seeds: Sequence[int]
) -> dict[int, list[RuleRun]]:
    """Per significand-bit count of the extra rounding, the rule on every seed."""
    return {b: [judge_seed(extra_rounding_backend(b), device, dtype, s) for s in seeds] for b in bits}
