"""An overflow reaching attention under autocast stays visible: an inf or NaN in one element of a
query, key or value makes exactly the outputs non-finite that IEEE arithmetic makes non-finite.

AMP's safety nets read non-finite values: GradScaler skips a step on an inf or NaN gradient, and
trainers skip or stop on a non-finite loss. A kernel that turns an overflowed activation into a
finite output (zeros) hides it from the loss. Observed here on ``F.scaled_dot_product_attention``
under autocast at three sequence lengths (:data:`LENGTHS`), causal and not.

Reference: attention written out in float64 (``softmax(q k^T / sqrt(d)) v`` by matmul, exp and
sum; ``scaled_dot_product_attention`` is never called), which gives NaN for a row whose scores hold
a NaN or a +inf (inf - inf) and ignores a key whose score is -inf. Each output element is judged by
finiteness only: the values of the finite elements are the op numerics suite's business.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.domains.autocast.known_issues import SDPA_INF, SDPA_NAN
from harness.domains.versions import minor
from harness.numerics.comparison import ClaimComparison, compare_claim

#: the sequence lengths: a short sequence, the length of the upstream report of a NaN turned to
#: zeros (pytorch/pytorch#141128), and the CPU flash kernel's blocked path; each release takes other
#: paths at some of them
LENGTHS = (5, 16, 64)
TENSORS = ("query", "key", "value")
VALUES = {"inf": math.inf, "nan": math.nan}
HEADS, WIDTH = 2, 16
#: the element overflowed: sequence position 3 (inside both lengths), the first feature, head 0
AT = (0, 0, 3, 0)


def reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Attention in float64, written out (``mask``: an additive one, ``-inf`` where a query may not
    look): which outputs IEEE arithmetic makes non-finite."""
    q, k, v = q.double(), k.double(), v.double()
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask.double()
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    return torch.matmul(weights / weights.sum(-1, keepdim=True), v)


@dataclass(frozen=True)
class Seen:
    """One case: how many outputs the reference makes non-finite, how many of those came out finite
    (``hidden``) and how many finite ones came out non-finite (``spurious``), or what raised."""

    length: int
    causal: bool
    expected: int
    hidden: int
    spurious: int
    error: str | None = None

    @property
    def where(self) -> str:
        return f"length {self.length}{', causal' if self.causal else ''}"


def observe(tensor: str, value: str, device: torch.device, dtype: torch.dtype) -> list[Seen]:
    """``tensor``'s element :data:`AT` set to ``value``, attention run under ``dtype`` autocast at
    every length, causal and not, each against :func:`reference`."""
    out = []
    for length in LENGTHS:
        for causal in (False, True):
            g = torch.Generator().manual_seed(length)
            qkv = [torch.randn(1, HEADS, length, WIDTH, generator=g) for _ in TENSORS]
            qkv[TENSORS.index(tensor)][AT] = VALUES[value]
            q, k, v = (t.to(device) for t in qkv)
            bad = ~reference(q, k, v, causal).isfinite()
            try:
                with torch.autocast(device.type, dtype=dtype):
                    got = ~F.scaled_dot_product_attention(q, k, v, is_causal=causal).isfinite()
            except RuntimeError as exc:
                out.append(Seen(length, causal, int(bad.sum()), 0, 0, f"{type(exc).__name__}: {exc}".splitlines()[0]))
                continue
            out.append(Seen(length, causal, int(bad.sum()), int((bad & ~got).sum()), int((got & ~bad).sum())))
    return out


def claim(seen: list[Seen], tensor: str, value: str, dtype: torch.dtype) -> ClaimComparison:
    """No output the float64 reference makes non-finite comes out finite, none it keeps finite
    comes out non-finite, nothing raised."""
    wrong = [
        f"{s.where}: raised {s.error}"
        if s.error
        else f"{s.where}: {s.hidden} of {s.expected} non-finite outputs came out finite"
        + (f", {s.spurious} finite ones non-finite" if s.spurious else "")
        for s in seen
        if s.error or s.hidden or s.spurious
    ]
    return compare_claim(
        f"attention_nonfinite.{tensor}.{value}.outputs_wrong",
        sum(s.hidden + s.spurious + (s.error is not None) for s in seen),
        not wrong,
        "an inf or NaN in attention's input makes exactly the outputs non-finite that float64 arithmetic does",
        detail=f"scaled_dot_product_attention under {dtype} autocast, {value} in the {tensor}: " + "; ".join(wrong),
        expected=0,
        allowance=0,
        unit="outputs",
    )


#: The registered issue each cell (tensor, value) fails with on the releases that have it, and the
#: lengths where it shows (the registry check observes the issue there).
ISSUE_CELLS: dict[tuple[str, str], tuple[str, tuple[int, ...]]] = {
    ("query", "nan"): (SDPA_NAN, (5,)),
    ("key", "nan"): (SDPA_NAN, (5,)),
    ("query", "inf"): (SDPA_INF, (16, 64)),
    ("key", "inf"): (SDPA_INF, (16, 64)),
}


def issue_lengths(issue: str, torch_version: str) -> tuple[int, ...]:
    """The lengths where ``issue`` hides outputs on this release: the NaN issue at every length on
    2.5 (pytorch/pytorch#141128), at the short one after its fix; the inf issue at 16 and 64."""
    if issue == SDPA_NAN and minor(torch_version) == "2.5":
        return LENGTHS
    return next(lengths for i, lengths in ISSUE_CELLS.values() if i == issue)


def only_hidden(seen: list[Seen], lengths: tuple[int, ...]) -> bool:
    """Whether ``seen`` fails in a registered issue's shape: outputs hidden at ``lengths`` and
    nowhere else, nothing raised, nothing non-finite that should not be. A kernel hiding more than
    the issue does is a failure of its own."""
    return (
        any(s.hidden for s in seen)
        and not any(s.hidden for s in seen if s.length not in lengths)
        and not any(s.error or s.spurious for s in seen)
    )


def issue_present(issue: str, device: torch.device) -> tuple[bool, str]:
    """``issue`` observed under bf16 autocast on its first cell: outputs hidden at its lengths."""
    tensor, value = next(c for c, v in ISSUE_CELLS.items() if v[0] == issue)
    lengths = issue_lengths(issue, torch.__version__)
    seen = observe(tensor, value, device, torch.bfloat16)
    at = [s for s in seen if s.length in lengths]
    present = only_hidden(seen, lengths)
    shown = "; ".join(f"{s.where}: {s.hidden} of {s.expected} hidden" for s in at)
    return present, f"{value} in the {tensor}: {shown}"
