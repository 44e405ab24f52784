"""What a family's checks need of a recorder: the one protocol the training and speed checks
record through, so that neither knows pytest or files (the plugin's ``amp_record`` is one)."""

from __future__ import annotations

from typing import Any, Protocol

from harness.domains.repro import FailureRepro
from harness.numerics.comparison import AnyComparison


class RowRecorder(Protocol):
    """What the training checks need of a recorder: a row, a verdict's row (returning whether it
    passed), and the tags that keep a failed check's script. The plugin's ``amp_record`` is one."""

    def __call__(
        self,
        metric: str,
        value: float | int | bool | None,
        *,
        unit: str = ...,
        expected: float | None = ...,
        allowance: float | None = ...,
        dtype: object = ...,
        device: object = ...,
        tags: dict[str, Any] | None = ...,
        note: str = ...,
        comparable: bool | None = ...,
        outcome: Any = ...,
        kind: Any = ...,
        drift: float | None = ...,
    ) -> None: ...

    def result(self, result: AnyComparison, *, repro: FailureRepro | None = None, **kw: Any) -> bool: ...

    def repro_tags(self, repro: FailureRepro | None) -> dict[str, Any]: ...
