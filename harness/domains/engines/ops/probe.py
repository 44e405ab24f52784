"""The probe: what autocast does with each op of the catalogue, as typed observations.

For each case the probe runs the op under ``torch.autocast`` with fp32 inputs, with inputs
already in the low-precision dtype, and (for ops with several tensor inputs) with mixed inputs,
and records the output dtype or the error. It then checks, as PyTorch's own autocast tests do,
that the autocast result is bitwise equal to running the op with autocast disabled on inputs cast
by hand to the dtype autocast chose. Pure: no pytest, no files.

The golden tables store :meth:`Probe.as_baseline` (the same JSON the earlier, stringly probe
wrote); everything in the harness reads the typed fields.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

import torch
from torch import nn

from harness.domains.call_capture import Captured, NotReplayable, capture
from harness.domains.engines.ops.catalogue import CATALOGUE, NOT_BITWISE_REPRODUCIBLE, OpCase
from harness.platform.kernels import first_line


@dataclass(frozen=True)
class Raised:
    """The op raised (a banned op, or one that autocast breaks) with this first line of its error."""

    message: str

    def __str__(self) -> str:
        return f"raises: {self.message}"


#: What one call gave: the output dtype's name, or the error.
Observation = str | Raised


class HandCast(Enum):
    """Autocast's result against the op run by hand on inputs cast to autocast's choice."""

    EQUAL = "equal"
    DIFFERENT = "different"
    #: the op alone differs run to run, so bitwise comparison means nothing
    NONDETERMINISTIC = "nondeterministic"
    #: the op refuses inputs of autocast's output dtype: autocast ran a composite op in parts (its
    #: last step on the lower-precision list), so there is no single op to run by hand
    COMPOSITE = "composite"


class Category(Enum):
    """The autocast list an op behaves as on a device, from its observations."""

    LOWER_PRECISION = "lower_precision"
    FP32 = "fp32"
    #: the promote list, or plain type promotion: the same result
    WIDEST_INPUT = "widest_input"
    FOLLOWS_INPUT = "follows_input"
    #: the banned list, or an op autocast breaks
    RAISES = "raises"


@dataclass(frozen=True)
class Probe:
    fp32_in: Observation
    lowp_in: Observation | None = None
    mixed_in: Observation | None = None
    #: None when the output is not floating point (nothing to cast by hand) or the op raised
    hand_cast: HandCast | None = None

    def category(self, dtype: torch.dtype) -> Category:
        if isinstance(self.fp32_in, Raised):
            return Category.RAISES
        if self.fp32_in == dtype_name(dtype):
            return Category.LOWER_PRECISION
        if self.lowp_in == "float32":
            return Category.FP32
        if self.mixed_in == "float32":
            return Category.WIDEST_INPUT
        return Category.FOLLOWS_INPUT

    def as_baseline(self) -> dict[str, Any]:
        """The golden-table row: observations as strings (dtype names or ``"raises: ..."``)."""
        row: dict[str, Any] = {"fp32_in": str(self.fp32_in)}
        for key, value in (("lowp_in", self.lowp_in), ("mixed_in", self.mixed_in)):
            if value is not None:
                row[key] = str(value)
        return row


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def first_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return first_tensor(out[0])
    raise TypeError(f"op returned {type(out).__name__}, not a tensor")


def _cast(arg: Any, dtype: torch.dtype) -> Any:
    if isinstance(arg, torch.Tensor) and arg.is_floating_point():
        return arg.to(dtype)
    if isinstance(arg, nn.Module):
        return copy.deepcopy(arg).to(dtype)
    return arg


def _float_tensor_count(args: Sequence[Any]) -> int:
    return sum(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)


def _mixed(args: Sequence[Any], dtype: torch.dtype) -> tuple[Any, ...]:
    """First floating tensor fp32, the other floating tensors in ``dtype``."""
    out, seen = [], False
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            out.append(a if not seen else a.to(dtype))
            seen = True
        else:
            out.append(a)
    return tuple(out)


def run_op(
    fn: Callable[..., Any], args: Sequence[Any], device_type: str, dtype: torch.dtype, enabled: bool = True
) -> torch.Tensor:
    """``fn(*args)`` under autocast (or with it disabled), its first tensor output: how every
    catalogue op is called, eager here and compiled in :mod:`harness.domains.compiled.catalogue`."""
    # dropout and other random ops draw the same numbers in both runs. The device's own generator:
    # torch.manual_seed also queues seeds for every uninitialised accelerator (CUDA, XPU, MTIA),
    # formatting the Python stack for each (measured: 1-4 ms a call, most of a policy table's time)
    torch.default_generator.manual_seed(0)
    if device_type == "cuda":
        torch.cuda.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation chatter is not policy; results are what count
        with torch.autocast(device_type, dtype=dtype, enabled=enabled):
            return first_tensor(fn(*args))


def _run(case: OpCase, args: Sequence[Any], device_type: str, dtype: torch.dtype, enabled: bool) -> torch.Tensor:
    return run_op(case.fn, args, device_type, dtype, enabled)


def _observe(case: OpCase, args: Sequence[Any], device_type: str, dtype: torch.dtype, width: int) -> Observation:
    try:
        return dtype_name(_run(case, args, device_type, dtype, True).dtype)
    except RuntimeError as exc:
        return Raised(first_line(exc)[:width])


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return bool(torch.equal(a, b))


def probe(case: OpCase, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Probe:
    """What autocast does with one op: output dtypes for fp32 / low-precision / mixed inputs, and
    whether the fp32-input result equals the op run by hand on inputs cast to autocast's choice."""
    g = torch.Generator().manual_seed(seed)
    args = case.make(g, device)
    try:
        out = _run(case, args, device.type, dtype, True)
    except RuntimeError as exc:
        return Probe(Raised(first_line(exc)[:120]))
    hand_cast: HandCast | None = None
    if out.is_floating_point():
        cast_args = [_cast(a, out.dtype) for a in args]
        try:
            manual = _run(case, cast_args, device.type, dtype, False)
        except RuntimeError:  # e.g. torch.pinverse on CUDA: SVD in fp32, its final matmul in bf16
            return Probe(dtype_name(out.dtype), *_low_and_mixed(case, args, device.type, dtype), HandCast.COMPOSITE)
        if case.name in NOT_BITWISE_REPRODUCIBLE or not bitwise_equal(
            manual, _run(case, cast_args, device.type, dtype, False)
        ):
            hand_cast = HandCast.NONDETERMINISTIC
        else:
            hand_cast = HandCast.EQUAL if bitwise_equal(out, manual) else HandCast.DIFFERENT
    return Probe(dtype_name(out.dtype), *_low_and_mixed(case, args, device.type, dtype), hand_cast)


def _low_and_mixed(
    case: OpCase, args: Sequence[Any], device_type: str, dtype: torch.dtype
) -> tuple[Observation, Observation | None]:
    """What the op gives on low-precision inputs, and on mixed ones (where it takes two floats)."""
    lowp = _observe(case, [_cast(a, dtype) for a in args], device_type, dtype, 80)
    mixed = _observe(case, _mixed(args, dtype), device_type, dtype, 80) if _float_tensor_count(args) >= 2 else None
    return lowp, mixed


def policy_table(device: torch.device, dtype: torch.dtype, cases: Sequence[OpCase] = CATALOGUE) -> dict[str, Probe]:
    return {c.name: probe(c, device, dtype) for c in cases if device.type in c.devices}


def registered_autocast_ops(device_type: str) -> list[str]:
    """aten ops with a kernel registered for the Autocast dispatch key of ``device_type``."""
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    return sorted(
        n for n in torch._C._dispatch_get_all_op_names() if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)
    )


def aten_base(op: str) -> str:
    """``aten::conv2d.padding`` -> ``conv2d``."""
    return op.removeprefix("aten::").split(".")[0]


#: The inputs of each golden-table observation, as :func:`probe` makes them.
INPUT_KINDS = ("fp32_in", "lowp_in", "mixed_in")


def replay(case: OpCase, device: torch.device, dtype: torch.dtype, inputs: str = "fp32_in") -> Captured:
    """The torch calls ``case`` makes under autocast for one of :data:`INPUT_KINDS`, as
    :func:`probe` calls it (same seed, same casts), kept as source for a standalone script.
    Raises :class:`~harness.domains.call_capture.NotReplayable` where a call cannot be written."""
    args = case.make(torch.Generator().manual_seed(0), device)
    if inputs == "lowp_in":
        args = tuple(_cast(a, dtype) for a in args)
    elif inputs == "mixed_in":
        args = _mixed(args, dtype)
    elif inputs != "fp32_in":
        raise ValueError(f"inputs must be one of {INPUT_KINDS}, not {inputs!r}")
    return capture(case.fn, args, lambda call: run_op(call, (), device.type, dtype))


#: At most this many ops in one script: a reader sees the defect in a screenful, the check's
#: message lists them all.
MAX_CASES = 8

#: the catalogue by op name (what a report row or a disagreement names)
BY_NAME: dict[str, OpCase] = {c.name: c for c in CATALOGUE}
P = TypeVar("P")


def replayed(
    wanted: Iterable[tuple[str, str, str, P]], device: torch.device, dtype: torch.dtype
) -> list[tuple[str, Captured, P]]:
    """``(label, catalogue op, input kind, payload)`` -> ``(label, its captured calls, payload)``,
    at most :data:`MAX_CASES`; an op whose calls cannot be written (or unknown) is left out."""
    cases: list[tuple[str, Captured, P]] = []
    for label, op, inputs, payload in wanted:
        try:
            cases.append((label, replay(BY_NAME[op], device, dtype, inputs), payload))
        except (NotReplayable, KeyError):
            continue
        if len(cases) == MAX_CASES:
            break
    return cases
