"""Claim family: which ops autocast runs in low precision and which fall back to fp32.

A torch or driver upgrade that silently moves an op between autocast's lists changes training
numerics or speed. The registered op lists and the observed behaviour of every catalogued op
(output dtype for fp32, low-precision and mixed inputs; bitwise equality with the op run by hand on
inputs cast to autocast's choice) are golden tables keyed by the torch minor version, per device
type and autocast dtype. A change fails with a per-op diff ("nn.LayerNorm.fp32_in: expected
'float32', got 'bfloat16'").
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from harness.domains.autocast import banned, oracle
from harness.domains.autocast.repro import (
    banned_repro,
    dtypes_repro,
    hand_cast_repro,
    policy_repro,
    registered_ops_repro,
)
from harness.domains.engines.ops.catalogue import CATALOGUE, INTERNAL_OPS, ISA_DEPENDENT_ON_CPU
from harness.domains.engines.ops.probe import Category, HandCast, aten_base, policy_table, registered_autocast_ops
from harness.domains.repro import FailureRepro
from harness.numerics.comparison import compare_claim, compare_members, compare_predicate
from harness.numerics.verdict import RowKind
from harness.storage.baselines import KeyKind

pytestmark = pytest.mark.amp_capability("autocast policy")

#: Categories whose ops autocast casts itself: there the result must equal the hand-cast op.
CASTING_CATEGORIES = (Category.LOWER_PRECISION, Category.FP32)


def _short(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@pytest.mark.amp_quick
def test_registered_autocast_ops_match_this_releases_baseline(amp_device, amp_record, amp_baseline):
    ops = registered_autocast_ops(amp_device.type)
    amp_record(f"registered_ops.{amp_device.type}", len(ops), unit="ops", device=amp_device)
    amp_baseline.check(
        f"registered_ops_{amp_device.type}",
        ops,
        key=KeyKind.STACK,
        device=str(amp_device),
        comparator=lambda stored, obtained: compare_members(
            f"registered Autocast{amp_device.type.upper()} ops", stored, obtained
        ),
        repro=lambda _diff, golden: registered_ops_repro(amp_device.type, golden, missing_only=False),
    )


@pytest.mark.amp_quick
def test_every_registered_autocast_op_is_exercised_through_a_public_api(amp_device, amp_record):
    registered = {aten_base(o) for o in registered_autocast_ops(amp_device.type)}
    covered = {a for c in CATALOGUE for a in c.aten if amp_device.type in c.devices} | set(INTERNAL_OPS)
    missing = sorted(registered - covered)
    amp_record.require(
        oracle.registered_coverage_claim(amp_device.type, registered, missing),
        device=amp_device,
        repro=registered_ops_repro(amp_device.type, sorted(covered), missing_only=True),
    )


def test_op_policy_matches_the_golden_table(amp_device, amp_dtype, amp_record, amp_baseline):
    table = policy_table(amp_device, amp_dtype)
    for op, probe in table.items():
        tags = {**probe.as_baseline(), "category": probe.category(amp_dtype).value}
        if probe.hand_cast is not None:
            tags["hand_cast"] = probe.hand_cast.value
        amp_record(f"policy.{op}", None, dtype=amp_dtype, device=amp_device, tags=tags, kind=RowKind.POLICY)
    # the golden table is the policy (output dtypes); bitwise equality is the next test's claim.
    # Ops whose CPU behaviour depends on the instruction set stay out of it (recorded above, and
    # as a finding of the hardware profile here): the table is keyed by torch release.
    isa = ISA_DEPENDENT_ON_CPU if amp_device.type == "cpu" else {}
    for op, why in isa.items():
        if op in table:
            amp_record(
                f"policy.{op}.depends_on_the_cpu",
                None,
                dtype=amp_dtype,
                device=amp_device,
                kind=RowKind.POLICY,
                tags=table[op].as_baseline(),
                note=why,
            )
    golden = {op: probe.as_baseline() for op, probe in table.items() if op not in isa}
    amp_baseline.check(
        f"policy_{amp_device.type}_{_short(amp_dtype)}",
        golden,
        key=KeyKind.STACK,
        device=str(amp_device),
        repro=lambda differences, _golden: policy_repro(differences, amp_device, amp_dtype),
    )


def test_autocast_equals_the_op_run_by_hand_on_inputs_cast_to_its_choice(amp_device, amp_dtype, amp_record):
    """As PyTorch's own autocast tests check: for ops on autocast's lists, bitwise equality."""
    table = policy_table(amp_device, amp_dtype)
    casting = {op: p for op, p in table.items() if p.category(amp_dtype) in CASTING_CATEGORIES}
    result = compare_predicate(
        f"autocast {amp_device.type}/{_short(amp_dtype)} vs hand-cast",
        list(casting),
        [p.hand_cast.value if p.hand_cast else None for p in casting.values()],
        lambda _op, seen: seen in (HandCast.EQUAL.value, HandCast.NONDETERMINISTIC.value, HandCast.COMPOSITE.value),
        "bitwise equal to the op with autocast disabled on inputs cast to autocast's output dtype",
    )
    failing = [op for op, p in casting.items() if p.hand_cast is HandCast.DIFFERENT]
    amp_record.require(
        result, dtype=amp_dtype, device=amp_device, repro=hand_cast_repro(failing, amp_device, amp_dtype)
    )


def test_float64_and_integer_inputs_are_never_cast(amp_device, amp_dtype, amp_record):
    dev = amp_device
    a64, w64 = torch.randn(4, 8, dtype=torch.float64, device=dev), torch.randn(5, 8, dtype=torch.float64, device=dev)
    ints, table = torch.arange(12, device=dev).reshape(3, 4), torch.randn(12, 3, device=dev)
    calls = {
        "F.linear(float64)": (lambda: F.linear(a64, w64), torch.float64),
        "torch.mm(float64)": (lambda: torch.mm(a64, w64.T), torch.float64),
        "F.softmax(float64)": (lambda: F.softmax(a64, -1), torch.float64),
        "torch.cumsum(int64)": (lambda: torch.cumsum(ints, 1), torch.int64),
        "torch.sum(int64)": (lambda: torch.sum(ints), torch.int64),
        "F.embedding(int64 indices)": (lambda: F.embedding(ints, table), torch.float32),
    }
    with torch.autocast(dev.type, dtype=amp_dtype):
        outputs = {label: call().dtype for label, (call, _) in calls.items()}
    expected = [e for _, e in calls.values()]
    wrong = [(label, call, e) for label, (call, e) in calls.items() if outputs[label] != e]
    amp_record.require(
        compare_predicate(
            "inputs autocast must not cast",
            list(outputs),
            list(outputs.values()),
            lambda a, b: a == b,
            "float64 and integer inputs keep their dtype",
            expected=expected,
        ),
        dtype=amp_dtype,
        device=amp_device,
        repro=dtypes_repro(
            "float64 and integer inputs under autocast keep their dtype",
            wrong,
            amp_device,
            amp_dtype,
            "exact: autocast casts only float32 (and low-precision) floating inputs",
        ),
    )


@pytest.mark.amp_cuda
def test_binary_cross_entropy_is_banned_under_cuda_autocast(amp_record):
    device = torch.device("cuda")
    amp_record.require(
        banned.bce_banned_claim(device, torch.float16),
        device="cuda",
        repro=banned_repro(device, torch.float16),
    )


#: The nested region as the check runs it and its script prints it (``a``, ``b``: fp32 inputs).
NESTED = """with torch.autocast(DEVICE, dtype=DTYPE):
    outer = torch.mm(a, b).dtype
    with torch.autocast(DEVICE, enabled=False):
        inner = torch.mm(a, b).dtype
    after = torch.mm(a, b).dtype"""
#: What it must give: low precision outside, fp32 inside the disabled region, low precision after.
NESTED_EXPECTED = "[DTYPE, torch.float32, DTYPE]"


def test_nested_autocast_disabled_region_runs_in_fp32(amp_device, amp_dtype, amp_record):
    a, b = torch.randn(4, 8, device=amp_device), torch.randn(8, 5, device=amp_device)
    ns = {"torch": torch, "a": a, "b": b, "DEVICE": amp_device.type, "DTYPE": amp_dtype}
    exec(NESTED, ns)
    got = [ns["outer"], ns["inner"], ns["after"]]
    script = f"""DEVICE, DTYPE = {amp_device.type!r}, {amp_dtype}
{NESTED}
got, expected = [outer, inner, after], {NESTED_EXPECTED}
print("outer, inner (autocast disabled), after:", got, "expected:", expected)
measured = sum(g != e for g, e in zip(got, expected))  # regions in another dtype
allowed = 0"""
    amp_record.require(
        compare_predicate(
            "nested autocast(enabled=False)",
            ["outer", "inner", "after"],
            got,
            lambda g, e: g == e,
            "low precision outside, fp32 inside the disabled region, low precision again after it",
            expected=[amp_dtype, torch.float32, amp_dtype],
        ),
        dtype=amp_dtype,
        device=amp_device,
        repro=FailureRepro(
            "autocast",
            "torch.mm's output dtype outside, inside and after an autocast(enabled=False) region",
            script,
            "exact: torch.autocast's documented nesting",
            {"a": a, "b": b},
            device=str(amp_device),
        ),
    )


class _CastCounter(TorchDispatchMode):
    """Counts casts of tensors of one shape from fp32 (autocast's casts run below this mode)."""

    def __init__(self, shape: torch.Size) -> None:
        super().__init__()
        self.shape, self.casts = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.overloadpacket in (torch.ops.aten._to_copy, torch.ops.aten.to) and args:
            src = args[0]
            if isinstance(src, torch.Tensor) and src.shape == self.shape and src.dtype == torch.float32:
                self.casts += 1
        return func(*args, **kwargs)


#: The regions as the check runs them and its script prints them (``layer``: an fp32 nn.Linear).
CAST_ONCE = """counter = _CastCounter(layer.weight.shape)
with counter:
    for _region in range(2):
        with torch.autocast(DEVICE.type, dtype=DTYPE):
            for _call in range(3):
                layer(torch.randn(4, 16, device=DEVICE))"""


def test_an_fp32_weight_is_cast_once_per_autocast_region(amp_device, amp_dtype, amp_record):
    """The cast cache: a leaf fp32 weight used by several ops in one region is cast once."""
    layer = torch.nn.Linear(16, 24).to(amp_device)
    ns = {"torch": torch, "layer": layer, "_CastCounter": _CastCounter, "DEVICE": amp_device, "DTYPE": amp_dtype}
    exec(CAST_ONCE, ns)
    casts = ns["counter"].casts
    script = f"""from torch.utils._python_dispatch import TorchDispatchMode


{inspect.getsource(_CastCounter)}

DEVICE, DTYPE = torch.device({str(amp_device)!r}), {amp_dtype}
layer = torch.nn.Linear(16, 24).to(DEVICE)
{CAST_ONCE}
print(f"the fp32 weight was cast {{counter.casts}} times in 2 autocast regions of 3 calls each")
measured = abs(counter.casts - 2)  # casts beyond (or short of) one per region
allowed = 0"""
    amp_record.require(
        compare_claim(
            "weight_casts.two_regions_three_calls_each",
            casts,
            casts == 2,
            "one cast per region: autocast's cast cache holds fp32 leaf weights until the region exits",
            detail=f"the fp32 weight was cast {casts} times in 2 autocast regions of 3 calls each (expected 2)",
            expected=2,
            allowance=0,
        ),
        dtype=amp_dtype,
        device=amp_device,
        repro=FailureRepro(
            "autocast",
            "casts of one fp32 nn.Linear weight in two autocast regions of three calls",
            script,
            "exact: autocast's cast cache keeps a leaf weight's cast until its region exits",
            device=str(amp_device),
        ),
    )
