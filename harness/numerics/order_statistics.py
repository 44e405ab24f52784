"""Order statistics: a distribution-free confidence interval of a median, and the fewest samples
that have one. Pure; the speed checks judge a speedup's median ratio with it."""

from __future__ import annotations

import math

#: Confidence of the interval a speedup is judged with (NOISY when it holds the threshold).
CONFIDENCE = 0.95


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics (k, n + 1 - k) with
    the largest k such that Binomial(n, 1/2) puts at most (1 - confidence) / 2 below k. Assumes
    only that the rounds are independent draws of one ratio; no normality."""
    xs = sorted(values)
    n = len(xs)
    tail = (1.0 - confidence) / 2.0
    k, below = 0, 0.0
    while k < n // 2:
        below += math.comb(n, k) / 2.0**n  # P(B <= k)
        if below > tail:
            break
        k += 1
    if k == 0:  # too few rounds for the confidence: the interval is unbounded
        return (0.0, math.inf)
    return (xs[k - 1], xs[n - k])


def smallest_confident_n(confidence: float = CONFIDENCE) -> int:
    """The fewest samples whose median interval at ``confidence`` is bounded."""
    n = 1
    while median_interval([float(i + 1) for i in range(n)], confidence)[0] == 0.0 and n < 1000:
        n += 1
    return n
