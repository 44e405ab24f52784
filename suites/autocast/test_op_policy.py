"""Claim family: which ops autocast runs in low precision and which fall back to fp32.

A torch or driver upgrade that silently moves an op between autocast's lists changes training
numerics or speed. The registered op lists and the observed behaviour of every catalogued op
(output dtype for fp32, low-precision and mixed inputs; bitwise equality with the op run by hand on
inputs cast to autocast's choice) are golden tables keyed by the torch minor version, per device
type and autocast dtype. A change fails with a per-op diff ("nn.LayerNorm.fp32_in: expected
'float32', got 'bfloat16'").
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from harness.domains.autocast.catalogue import CATALOGUE, INTERNAL_OPS, ISA_DEPENDENT_ON_CPU
from harness.domains.autocast.probe import Category, HandCast, aten_base, policy_table, registered_autocast_ops
from harness.numerics.comparison import compare_claim, compare_predicate
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
    amp_baseline.check(f"registered_ops_{amp_device.type}", ops, key=KeyKind.STACK, device=str(amp_device))


@pytest.mark.amp_quick
def test_every_registered_autocast_op_is_exercised_through_a_public_api(amp_device, amp_record):
    registered = {aten_base(o) for o in registered_autocast_ops(amp_device.type)}
    covered = {a for c in CATALOGUE for a in c.aten if amp_device.type in c.devices} | set(INTERNAL_OPS)
    missing = sorted(registered - covered)
    amp_record.require(
        compare_claim(
            f"catalogue_coverage.{amp_device.type}",
            len(registered) - len(missing),
            not missing,
            "every registered autocast op is reached by the catalogue (harness.domains.autocast.catalogue.CATALOGUE)",
            detail=f"{len(missing)} op(s) registered for Autocast{amp_device.type.upper()} in torch {torch.__version__} are "
            f"not in the catalogue: {', '.join(missing)}. Add a row calling each through its public API to "
            "harness/domains/autocast/catalogue.py (or to INTERNAL_OPS, naming the public API that reaches it).",
            expected=len(registered),
            allowance=0,
            unit="ops",
        ),
        device=amp_device,
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
        f"policy_{amp_device.type}_{_short(amp_dtype)}", golden, key=KeyKind.STACK, device=str(amp_device)
    )


def test_autocast_equals_the_op_run_by_hand_on_inputs_cast_to_its_choice(amp_device, amp_dtype, amp_record):
    """As PyTorch's own autocast tests check: for ops on autocast's lists, bitwise equality."""
    table = policy_table(amp_device, amp_dtype)
    casting = {op: p for op, p in table.items() if p.category(amp_dtype) in CASTING_CATEGORIES}
    result = compare_predicate(
        f"autocast {amp_device.type}/{_short(amp_dtype)} vs hand-cast",
        list(casting),
        [p.hand_cast.value if p.hand_cast else None for p in casting.values()],
        lambda _op, seen: seen in (HandCast.EQUAL.value, HandCast.NONDETERMINISTIC.value),
        "bitwise equal to the op with autocast disabled on inputs cast to autocast's output dtype",
    )
    amp_record.require(result, dtype=amp_dtype, device=amp_device)


def test_float64_and_integer_inputs_are_never_cast(amp_device, amp_dtype, amp_record):
    dev = amp_device
    a64, w64 = torch.randn(4, 8, dtype=torch.float64, device=dev), torch.randn(5, 8, dtype=torch.float64, device=dev)
    ints = torch.arange(12, device=dev).reshape(3, 4)
    with torch.autocast(dev.type, dtype=amp_dtype):
        outputs = {
            "F.linear(float64)": F.linear(a64, w64).dtype,
            "torch.mm(float64)": torch.mm(a64, w64.T).dtype,
            "F.softmax(float64)": F.softmax(a64, -1).dtype,
            "torch.cumsum(int64)": torch.cumsum(ints, 1).dtype,
            "torch.sum(int64)": torch.sum(ints).dtype,
            "F.embedding(int64 indices)": F.embedding(ints, torch.randn(12, 3, device=dev)).dtype,
        }
    expected = [torch.float64] * 3 + [torch.int64, torch.int64, torch.float32]
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
    )


@pytest.mark.amp_cuda
def test_binary_cross_entropy_is_banned_under_cuda_autocast(amp_record):
    p, t = torch.rand(4, device="cuda"), torch.rand(4, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, t)
    amp_record.require(
        compare_claim("binary_cross_entropy.raises", True, True, "banned under CUDA autocast: raises"), device="cuda"
    )


def test_nested_autocast_disabled_region_runs_in_fp32(amp_device, amp_dtype, amp_record):
    a, b = torch.randn(4, 8, device=amp_device), torch.randn(8, 5, device=amp_device)
    with torch.autocast(amp_device.type, dtype=amp_dtype):
        outer = torch.mm(a, b).dtype
        with torch.autocast(amp_device.type, enabled=False):
            inner = torch.mm(a, b).dtype
        after = torch.mm(a, b).dtype
    got = [outer, inner, after]
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


def test_an_fp32_weight_is_cast_once_per_autocast_region(amp_device, amp_dtype, amp_record):
    """The cast cache: a leaf fp32 weight used by several ops in one region is cast once."""
    layer = torch.nn.Linear(16, 24).to(amp_device)
    counter = _CastCounter(layer.weight.shape)
    with counter:
        for _region in range(2):
            with torch.autocast(amp_device.type, dtype=amp_dtype):
                for _call in range(3):
                    layer(torch.randn(4, 16, device=amp_device))
    amp_record.require(
        compare_claim(
            "weight_casts.two_regions_three_calls_each",
            counter.casts,
            counter.casts == 2,
            "one cast per region: autocast's cast cache holds fp32 leaf weights until the region exits",
            detail=f"the fp32 weight was cast {counter.casts} times in 2 autocast regions of 3 calls each (expected 2)",
            expected=2,
            allowance=0,
        ),
        dtype=amp_dtype,
        device=amp_device,
    )
