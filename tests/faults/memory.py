"""Faults of the memory family: a release whose autocast never enables itself (fp32 activations saved for backward), an optimizer default that adds state. Each is a factory ``fault(original) -> replacement`` or a
subclass wrong in one way, named by the negative controls that inject it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def autocast_disabled(real: Callable[..., None]) -> Callable[..., None]:
    """``torch.autocast`` that never enables itself (a release whose autocast silently does
    nothing): every region runs in fp32, and saves fp32 activations for backward."""

    def __init__(
        self: Any, device_type: str, dtype: Any = None, enabled: bool = True, cache_enabled: Any = None
    ) -> None:
        real(self, device_type, dtype=dtype, enabled=False, cache_enabled=cache_enabled)

    return __init__


def adamw_amsgrad_by_default(real: Callable[..., None]) -> Callable[..., None]:
    """``AdamW`` built with ``amsgrad=True`` unless told otherwise (a changed default): a third
    fp32 buffer per parameter, ``max_exp_avg_sq``, in the optimizer state."""

    def __init__(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("amsgrad", True)
        real(self, params, *args, **kwargs)

    return __init__
