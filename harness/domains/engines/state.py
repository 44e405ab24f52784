"""Bitwise comparison of parameters and optimizer state: what a skipped step must leave as it was.

The scaler family's overflow checks, the training engine's injected overflows and a user's own
training step are judged by the same rule: bitwise, NaN equal to NaN, and state an overflow created
must be its initial zeros.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def repeated(run: Callable[[], T], differing: Callable[[T, T], Sequence[str]]) -> tuple[T, list[str]]:
    """The reference ``run`` twice: its first result, and what differed between the two runs
    (``differing``'s words; empty where the device repeats it bit for bit)."""
    first = run()
    return first, list(differing(first, run()))


def state_of(opt: torch.optim.Optimizer, params: list[torch.nn.Parameter]) -> dict[int, dict[str, torch.Tensor]]:
    """Copies of the optimizer's state tensors, keyed by parameter index."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for i, p in enumerate(params):
        entries = opt.state.get(p, {})
        out[i] = {k: v.detach().clone() for k, v in entries.items() if isinstance(v, torch.Tensor)}
    return out


def differences(
    params_before: Sequence[torch.Tensor],
    params_after: Sequence[torch.Tensor],
    state_before: Mapping[Any, Mapping[str, Any]],
    state_after: Mapping[Any, Mapping[str, Any]],
    names: Sequence[str] | None = None,
) -> list[str]:
    """What a skipped step changed: parameters, optimizer state tensors or step counts (bitwise,
    NaN equal to NaN), or state created with other than its initial zeros. State is keyed by
    parameter (index or name); ``names`` label the parameters in what is said."""
    label = (lambda i: str(names[i])) if names is not None else str
    out = []
    for i, (b, a) in enumerate(zip(params_before, params_after, strict=True)):
        if not same_bits(b, a):
            out.append(f"parameter {label(i)} ({int((b != a).sum())} of {b.numel()} elements)")
    for key, after in state_after.items():
        before = state_before.get(key, {})
        for entry, value in after.items():
            if entry in before:
                if not same_bits(before[entry], value):
                    out.append(f"state {entry} of parameter {key}")
            elif isinstance(value, torch.Tensor) and bool((value != 0).any()):
                out.append(f"state {entry} of parameter {key} created non-zero ({value.flatten()[:3].tolist()})")
    return out


def same_bits(a: Any, b: Any) -> bool:
    """Bitwise equality of two state entries, NaN equal to NaN (non-tensors by ==)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return bool(a == b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    nan_a, nan_b = a.isnan(), b.isnan()
    return torch.equal(nan_a, nan_b) and torch.equal(a.masked_fill(nan_a, 0), b.masked_fill(nan_b, 0))


#: The registered known issue of torch's fused SGD (harness/domains/scaler/known_issues.py).
