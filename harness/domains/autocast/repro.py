"""Standalone scripts for the autocast policy checks: the ops whose observations left the golden
table, or whose autocast result is not the hand-cast op's, replayed from their captured calls."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from harness.domains.autocast.oracle import ACCEPTED, CLASSES, LISTS, Disagreement
from harness.domains.call_capture import Captured, NotReplayable, capture, case_functions, observe_src, observed_cases
from harness.domains.engines.ops.probe import BY_NAME, INPUT_KINDS, MAX_CASES, dtype_name, replay, replayed
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src, upcast_src
from harness.numerics.comparison import DataComparison

#: the policy's claims, standalone: ``scripts/autocast.py``
AUTOCAST = ScriptTemplate(__package__ or "harness.domains.autocast", "autocast")
_WORDS = {"fp32_in": "fp32 inputs", "lowp_in": "low-precision inputs", "mixed_in": "mixed inputs"}


def _split(path: str) -> tuple[str, str] | None:
    """``"nn.LayerNorm.fp32_in"`` -> (op, inputs); None for a path of another shape."""
    op, _, inputs = path.rpartition(".")
    return (op, inputs) if op in BY_NAME and inputs in INPUT_KINDS else None


def policy_repro(differences: DataComparison, device: torch.device, dtype: torch.dtype) -> FailureRepro | None:
    """The golden-table observations that changed, each replayed under autocast against the
    table's value (ops new to or gone from the table have nothing to replay)."""
    changed = [
        (d, split)
        for d in differences.differences
        if (split := _split(d.path)) is not None and isinstance(d.expected, str) and d.actual is not None
    ]
    cases = replayed(
        ((f"{op} with {_WORDS[inputs]}", op, inputs, str(d.expected)) for d, (op, inputs) in changed), device, dtype
    )
    if not cases:
        return None
    return autocast_dtypes(
        f"ops whose output dtype under {device.type} autocast ({dtype}) left the golden table",
        cases,
        str(device),
        dtype,
        "exact: the golden table the harness stored from a run of this torch release",
    )


def hand_cast_repro(ops: Sequence[str], device: torch.device, dtype: torch.dtype) -> FailureRepro | None:
    """The ops whose autocast result differs from the hand-cast run, replayed."""
    cases = replayed(((op, op, "fp32_in", None) for op in ops), device, dtype)
    if not cases:
        return None
    return autocast_hand_cast(
        f"ops whose {device.type} autocast result ({dtype}) is not the op run by hand on inputs cast to its choice",
        [(label, cap) for label, cap, _ in cases],
        str(device),
        dtype,
    )


def lists_repro(disagreements: Sequence[Disagreement], device: torch.device, dtype: torch.dtype) -> FailureRepro | None:
    """The ops that behave otherwise than PyTorch's own autocast test lists file them, each
    observed as the probe observes it."""
    cases: list[tuple[str, dict[str, Captured], str, list[str]]] = []
    for d in disagreements[:MAX_CASES]:
        case = BY_NAME.get(d.case)
        if case is None:
            continue
        kinds = [k for k in INPUT_KINDS if k == "fp32_in" or d.probe.as_baseline().get(k) is not None]
        try:
            caps = {k: replay(case, device, dtype, k) for k in kinds}
        except NotReplayable:
            continue
        cases.append((f"{d.case} ({d.upstream_op})", caps, d.expected.value, [c.value for c in ACCEPTED[d.expected]]))
    if not cases:
        return None
    return autocast_categories(
        f"ops whose {device.type} autocast behaviour ({dtype}) is not how PyTorch's own autocast test lists file them",
        cases,
        str(device),
        dtype,
        "exact: the lists torch ships (torch/testing/_internal/autocast_test_lists.py)",
    )


def dtypes_repro(
    what: str,
    cases: Sequence[tuple[str, Callable[[], Any], torch.dtype]],
    device: torch.device,
    dtype: torch.dtype,
    origin: str,
) -> FailureRepro | None:
    """Calls a check made itself (``label, call, expected output dtype``), captured under autocast."""
    kept: list[tuple[str, Captured, str]] = []
    for label, call, expected in cases[:MAX_CASES]:

        def run(thunk: Callable[[], Any]) -> Any:
            torch.manual_seed(0)
            with torch.autocast(device.type, dtype=dtype):
                return thunk()

        try:
            kept.append((label, capture(call, (), run), dtype_name(expected)))
        except NotReplayable:
            continue
    return autocast_dtypes(what, kept, str(device), dtype, origin) if kept else None


def banned_repro(device: torch.device, dtype: torch.dtype) -> FailureRepro:
    """binary_cross_entropy under autocast, which must raise autocast's refusal."""
    code = AUTOCAST.fill("banned", values={"DEVICE": repr(device.type), "DTYPE": dtype_src(dtype)})
    return FailureRepro(
        "autocast",
        f"binary_cross_entropy under {device.type} autocast: 1 where it runs or raises another error",
        code,
        "exact: autocast refuses it",
        device=device.type,
    )


def fast_path_repro(module: str, device: torch.device, dtype: torch.dtype) -> FailureRepro:
    """A module's fused inference fast path under autocast, which must run and give finite values."""
    values = {"FAST_DEVICE": repr(device.type), "FAST_DTYPE": dtype_src(dtype), "MODULE": repr(module)}
    return FailureRepro(
        "autocast",
        f"{module}'s inference fast path under {device.type} autocast: 1 where it raises or gives non-finite values",
        AUTOCAST.fill("fast_path", values=values),
        "exact: the fused path runs",
        device=device.type,
    )


def registered_ops_repro(device_type: str, expected: Sequence[str], *, missing_only: bool) -> FailureRepro:
    """The aten ops with an autocast kernel for ``device_type`` against a list: the golden one
    (every op added or gone), or the catalogue's reach (``missing_only``: registered, not reached)."""
    key = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}[device_type]
    listed = textwrap.fill(", ".join(repr(o) for o in expected), 96, initial_indent="    ", subsequent_indent="    ")
    values = {"KEY": repr(key), "MISSING_ONLY": repr(missing_only), "EXPECTED": f"[\n{listed}\n]"}
    code = AUTOCAST.fill("registered_ops", values=values)
    what = (
        f"aten ops registered for {key} that the harness's op catalogue does not reach"
        if missing_only
        else f"aten ops registered for {key} against the golden list"
    )
    origin = "exact: " + (
        "the catalogue's coverage" if missing_only else "the golden list stored by the harness from a run"
    )
    return FailureRepro("autocast", what, code, origin)


def coverage_repro(
    device_type: str, listed: Sequence[str], uncovered: Sequence[str], source: Path | None = None
) -> FailureRepro:
    """The ops PyTorch's autocast test lists name for ``device_type`` against those the catalogue
    reaches (or a table explains) as the check found them: the script reads the installed torch's
    lists as the check does (an AST walk, nothing imported), so it names each op the harness's
    catalogue needs a row for. ``source``: a lists file the check was given instead of the
    installed torch's."""

    reached = sorted(set(listed) - set(uncovered))
    wrapped = textwrap.fill(", ".join(repr(o) for o in reached), 96, initial_indent="    ", subsequent_indent="    ")
    values = {
        "LISTS_FILE": repr(None if source is None else str(source)),
        "CLASS": repr(CLASSES[device_type]),
        "DEVICE_TYPE": repr(device_type),
        "LISTS": repr(sorted(LISTS)),
        "REACHED": f"[\n{wrapped}\n]",
    }
    code = AUTOCAST.fill("coverage", values=values)
    return FailureRepro(
        "autocast",
        f"ops PyTorch's {CLASSES[device_type]} lists that amp-harness's op catalogue does not reach",
        code,
        "exact: the catalogue's coverage (a failure here asks for a catalogue row, not an upstream fix)",
    )


# -- builders: an op against float64, observed dtypes, the hand-cast run, PyTorch's lists ------
def op_against_float64(
    what: str,
    call: str,
    tensors: Mapping[str, torch.Tensor],
    bound: torch.Tensor,
    origin: str,
    *,
    autocast: tuple[str, torch.dtype] | None,
    device: str = "cpu",
) -> FailureRepro:
    """``call`` (an expression of the tensors' names) under autocast (or as is), against the same
    expression on the inputs upcast exactly to float64; the worst element's error over its
    ``bound`` (saved with the inputs, derived by the check from the format) must be at most 1."""
    run = f"got = {call}"
    if autocast is not None:
        run = f'with torch.autocast("{autocast[0]}", dtype={dtype_src(autocast[1])}):\n    got = {call}'
    code = f"""{run}
# reference: the same computation on the same inputs upcast exactly to float64
{upcast_src(tensors)}
ref = {call}
err = (got.double() - ref).abs()
ratio = torch.where(err == 0, torch.zeros_like(err), err / bound.double())
measured = float(ratio.max())  # the worst element's error, in units of its budget
allowed = 1.0"""
    return FailureRepro(
        "op",
        what,
        code,
        origin,
        {**tensors, "bound": bound.detach()},
        device=device,
    )


def autocast_dtypes(
    what: str, cases: Sequence[tuple[str, Captured, str]], device: str, dtype: torch.dtype, origin: str
) -> FailureRepro:
    """Each case's calls under autocast: the output dtype (or the error's first line) against the
    ``expected`` one (the golden table's, or the rule's)."""
    prelude, tensors = observed_cases(
        [(label, cap) for label, cap, _ in cases], [f", {exp!r}" for _, _, exp in cases], device, dtype
    )
    reference = "# reference: what the check expected (output dtype, or the start of the error's first line)\nCASES = ["
    code = f"""{prelude.replace("CASES = [", reference, 1)}
measured = 0
for label, run, inputs, expected in CASES:
    seen = observe(run, inputs)
    same = seen == expected or (expected.startswith("raises: ") and seen.startswith(expected))
    print(f"{{label}}: autocast gives {{seen}}; expected {{expected}}" + ("" if same else "   <- differs"))
    measured += not same  # observations unlike the expected ones
allowed = 0"""
    return FailureRepro("autocast", what, code, origin, tensors, device=device)


def autocast_hand_cast(
    what: str, cases: Sequence[tuple[str, Captured]], device: str, dtype: torch.dtype
) -> FailureRepro:
    """Each case under autocast against the same calls with autocast disabled on its inputs cast
    by hand to the dtype autocast chose: bitwise equal, as PyTorch's own autocast tests require."""
    defs, calls, tensors = case_functions(cases)
    rows = "".join(f"\n    ({label!r}, {call})," for (label, _), call in zip(cases, calls, strict=True))
    values = {"DEVICE": repr(device.split(":")[0]), "DTYPE": dtype_src(dtype), "CASES": f"[{rows}\n]"}
    code = AUTOCAST.fill("cases", "hand_cast", values=values, replace={"cases": "\n\n\n".join(defs)})
    return FailureRepro(
        "autocast", what, code, "exact: bitwise equality (autocast casts, then runs the op)", tensors, device=device
    )


def autocast_categories(
    what: str,
    cases: Sequence[tuple[str, Mapping[str, Captured], str, Sequence[str]]],
    device: str,
    dtype: torch.dtype,
    origin: str,
) -> FailureRepro:
    """Each case observed with fp32, low-precision and (where it has two tensor inputs) mixed
    inputs, the autocast list it behaves as decided from them, against the ``accepted`` lists of
    its ``expected`` filing (PyTorch's own autocast test lists)."""
    flat = [(f"{label} {kind}", cap) for label, caps, _, _ in cases for kind, cap in caps.items()]
    defs, calls, tensors = case_functions(flat)
    it = iter(calls)
    rows = "".join(
        f"\n    ({label!r}, {{{', '.join(f'{k!r}: ({next(it)})' for k in caps)}}}, {exp!r}, {list(ok)!r}),"
        for label, caps, exp, ok in cases
    )
    values = {"LOW": repr(dtype_src(dtype).removeprefix("torch.")), "FILED": f"[{rows}\n]"}
    replace = {"cases": "\n\n\n".join(defs), "observe": observe_src(device, dtype)}
    code = AUTOCAST.fill("cases", "observe", "categories", values=values, replace=replace)
    return FailureRepro("autocast", what, code, origin, tensors, device=device)
