"""fp32 -> bf16 stochastic rounding, standalone, against the rule it promises: each draw one of
the input's two bf16 neighbours (from the fp32 bits), the count away from zero Binomial(N, p)
with p the low 16 bits over 2^16, judged by exact binomial p-values (log-gamma sums), Bonferroni
over the inputs; and that the rounding is random (two seeds differ) and replayable (one seed, one
sequence).

amp-harness writes a failed check's inputs and values over the defaults below and keeps the
``torchao`` block (its ``_fp32_to_bf16_sr``, imported where it is called;
``harness.domains.stochastic_rounding.repro``). As it lies here the ``stand_in`` block rounds with torch alone:
a uniform 16-bit integer added below bf16's last bit, then the low bits cut.
"""

import math

import torch

# -- inputs --
x = torch.tensor([1.0 + 2.0**-9, 3.0 + 2.0**-8, -0.1, 1e-3, 7.0 + 2.0**-7])

# -- torchao --


def rounded(x: torch.Tensor) -> torch.Tensor:  # torchao's stochastic rounding of each row of x
    from torchao.optim.quant_utils import _fp32_to_bf16_sr

    got: torch.Tensor = _fp32_to_bf16_sr(x)
    return got


# -- stand_in --


def rounded(x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-redef]  # noqa: F811
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32)
    bits = (x.view(torch.int32) + noise) & ~0xFFFF
    return bits.view(torch.float32).to(torch.bfloat16)


# -- counts --
N = 1000  # draws of each input
SEED = 0
FALSE_ALARM = 1e-6  # the chance a correct rounding fails this judgement
torch.manual_seed(SEED)
got = rounded(x.unsqueeze(0).expand(N, -1).contiguous()).to(torch.float64)
# reference: the bf16 neighbours toward and away from zero, and the exact chance of rounding away
bits = x.view(torch.int32).to(torch.int64)
lo = (bits & ~0xFFFF).to(torch.int32).view(torch.float32).to(torch.float64)
hi = ((bits & ~0xFFFF) + 0x10000).to(torch.int32).view(torch.float32).to(torch.float64)
p_away = ((bits & 0xFFFF).to(torch.float64) / 65536).tolist()
off = int((~((got == lo) | (got == hi))).sum())
away = (got == hi).sum(0).tolist()


def two_sided(k: int, p: float) -> float:  # exact Binomial(N, p) two-sided p-value: twice the smaller tail
    if p in (0.0, 1.0):
        return 1.0 if k == N * p else 0.0
    pmf = [
        math.exp(
            math.lgamma(N + 1)
            - math.lgamma(i + 1)
            - math.lgamma(N - i + 1)
            + i * math.log(p)
            + (N - i) * math.log1p(-p)
        )
        for i in range(N + 1)
    ]
    return min(1.0, 2 * min(sum(pmf[: k + 1]), sum(pmf[k:])))


adjusted = [two_sided(k, p) * len(away) for k, p in zip(away, p_away, strict=True)]  # Bonferroni over the inputs
i = min(range(len(adjusted)), key=adjusted.__getitem__)
print(f"draws off the two neighbours: {off} of {got.numel()}")
print(
    f"input {x[i].item()!r}: {away[i]} of {N} draws away from zero, {N * p_away[i]:.4g} expected; "
    f"adjusted p-value {adjusted[i]:.3g}"
)
# -log10 of the adjusted p-value (inf: draws off the neighbours); a correct rounding exceeds the
# allowed -log10(FALSE_ALARM) once in 1 / FALSE_ALARM runs
measured = math.inf if off else -math.log10(max(adjusted[i], 1e-300))
allowed = -math.log10(FALSE_ALARM)

# -- draws_inputs --
x = torch.tensor([7.0 + 2.0**-6])  # halfway between its bf16 neighbours

# -- draws --
N = 64  # draws of the halfway input
SEED = 0


def draw(s: int) -> torch.Tensor:  # N draws under torch.manual_seed(s), as the check drew them
    torch.manual_seed(s)
    return rounded(x.unsqueeze(0).expand(N, -1).contiguous()).to(torch.float64)


a, b, again = draw(SEED), draw(SEED + 1), draw(SEED)
# reference: a stochastic rounding is random (both neighbours of a halfway input, all one with
# chance (1/2)^(N-1); two seeds alike with chance (1/2)^N) and replayable (one seed, one sequence)
wrong = []
if torch.unique(a).numel() != 2:
    wrong.append(f"{N} draws of a halfway input gave {torch.unique(a).numel()} distinct values, not both neighbours")
if torch.equal(a, b):
    wrong.append(f"seeds {SEED} and {SEED + 1} drew the same {N} values")
if not torch.equal(a, again):
    wrong.append(f"seed {SEED} drew {int((a != again).sum())} of {N} values differently the second time")
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0
