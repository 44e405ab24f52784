"""Ops autocast refuses to run: ``binary_cross_entropy`` under CUDA autocast raises ("unsafe to
autocast"), because its fp16 gradient loses what ``binary_cross_entropy_with_logits`` keeps. A
stack on which it silently runs trains a sigmoid-then-BCE model in fp16 without telling anyone.
The verdict is decided here; the suite states the claim."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.numerics.comparison import ClaimComparison, compare_claim

#: what autocast's refusal says (the error's text, PyTorch's autocast_mode.cpp)
REFUSAL = "unsafe to autocast"


def bce_under_autocast(device: torch.device, dtype: torch.dtype) -> str:
    """What ``binary_cross_entropy`` of fp32 probabilities does under autocast to ``dtype``: the
    first line of the error it raises, or ``returned <output dtype>``."""
    p = torch.rand(4, generator=torch.Generator().manual_seed(0)).to(device)
    t = torch.rand(4, generator=torch.Generator().manual_seed(1)).to(device)
    try:
        with torch.autocast(device.type, dtype=dtype):
            out = F.binary_cross_entropy(p, t)
    except RuntimeError as exc:
        return (str(exc).strip().splitlines() or [""])[0]
    return f"returned {str(out.dtype).removeprefix('torch.')}"


def bce_banned_claim(device: torch.device, dtype: torch.dtype) -> ClaimComparison:
    """binary_cross_entropy under autocast raises autocast's refusal (not another error, not a result)."""
    seen = bce_under_autocast(device, dtype)
    refused = REFUSAL in seen
    return compare_claim(
        "binary_cross_entropy.raises",
        int(not refused),
        refused,
        f"binary_cross_entropy is banned under {device.type} autocast ({str(dtype).removeprefix('torch.')}): it "
        f"raises '{REFUSAL}' (use binary_cross_entropy_with_logits)",
        detail="" if refused else f"binary_cross_entropy under autocast: {seen}",
        expected=0,
        allowance=0,
        unit="errors",
    )
