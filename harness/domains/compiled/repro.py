"""The compiled family's reproductions: ops' compiled output dtypes against eager's."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.domains.call_capture import Captured, observed_cases
from harness.domains.repro import FailureRepro


def compiled_dtypes(
    what: str, cases: Sequence[tuple[str, Captured]], device: str, dtype: torch.dtype, backend: str
) -> FailureRepro:
    """Each case's calls under autocast, eager and through ``torch.compile(backend=...)``: the
    compiled output dtype (or the error's first line) against eager's, computed beside it."""
    prelude, tensors = observed_cases(cases, ["" for _ in cases], device, dtype)
    code = f"""{prelude}
measured = 0
for label, run, inputs in CASES:
    eager = observe(run, inputs)  # reference: the same calls, eager, under the same autocast
    torch._dynamo.reset()  # each op compiled on its own, as the check compiles it
    compiled = observe(torch.compile(run, backend={backend!r}), inputs)
    print(f"{{label}}: compiled {{compiled}}, eager {{eager}}" + ("" if compiled == eager else "   <- differs"))
    measured += compiled != eager  # ops whose compiled output dtype is not eager's
allowed = 0"""
    return FailureRepro(
        "compiled", what, code, "exact: autocast's choice of dtype is eager's, compiled or not", tensors, device=device
    )
