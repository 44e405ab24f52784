"""The stochastic-rounding family's reproductions: torchao's fp32 -> bf16 stochastic rounding's
draws against the rule it promises (``scripts/stochastic.py``)."""

from __future__ import annotations

import torch

from harness.domains.repro import FailureRepro, ScriptTemplate

STOCHASTIC = ScriptTemplate(__package__ or "harness.domains.stochastic_rounding", "stochastic")


def stochastic_rounding(what: str, x: torch.Tensor, draws: int, seed: int, false_alarm: float) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding, ``draws`` draws of each input under one seed,
    against the rule it promises: each draw one of the input's two bf16 neighbours (from the fp32
    bits), the count away from zero Binomial(draws, p) with p the low 16 bits over 2^16, judged
    by exact binomial p-values (log-gamma sums), Bonferroni over the inputs."""
    values = {"N": repr(draws), "SEED": repr(seed), "FALSE_ALARM": repr(false_alarm)}
    code = STOCHASTIC.fill("torchao", "counts", values=values)
    return FailureRepro(
        "stochastic_rounding",
        what,
        code,
        f"every draw a neighbour (exact); each input's count away from zero Binomial({draws}, p): a correct "
        f"rounding falls below the adjusted p-value {false_alarm:g} once in {1 / false_alarm:.0e} runs",
        {"x": x},
        needs=("torch", "torchao"),
    )


def stochastic_draws(what: str, x: torch.Tensor, draws: int, seed: int) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding of ``x`` (one input halfway between its bf16
    neighbours), ``draws`` times under ``seed``, ``seed + 1`` and ``seed`` again: both neighbours
    drawn, the seeds' draws different, the repeated seed's the same."""
    code = STOCHASTIC.fill("torchao", "draws", values={"N": repr(draws), "SEED": repr(seed)})
    return FailureRepro(
        "stochastic_rounding",
        what,
        code,
        f"exact, up to chance: a correct rounding fails the first two with chance (1/2)^{draws - 1} and "
        f"(1/2)^{draws}, the third never",
        {"x": x},
        needs=("torch", "torchao"),
    )
