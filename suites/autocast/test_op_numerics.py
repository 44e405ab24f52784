"""Claim family: under autocast, each op's error against a float64 reference stays inside a
budget derived from unit roundoff, reduction length and the magnitudes involved; and the fp32
fallbacks exist for a reason (forcing those ops into fp16/bf16 breaks the budget).

hypothesis draws shapes (long reductions included), magnitudes (tiny, huge, mixed scales, large
offsets, values near the fp16 maximum) and layouts (transposed, strided). The budget functions
and their derivations are in :mod:`harness.numerics.budgets`; each report row carries the worst
error/budget ratio seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.domains.autocast.repro import op_against_float64
from harness.numerics import budgets as bd
from harness.numerics.comparison import compare_claim, compare_within, explain
from harness.numerics.formats import FP32, format_of

pytestmark = pytest.mark.amp_capability("numerics")

SCALES = {"unit": 1.0, "tiny": 1e-4, "huge": 1e3, "mixed": None}


def _values(seed: int, shape: tuple[int, ...], scale: str, offset: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if scale == "mixed":
        x = x * torch.pow(10.0, torch.empty(*shape, dtype=torch.float64).uniform_(-3, 3, generator=g))
    else:
        x = x * SCALES[scale]
    return (x + offset).to(torch.float32)


def _layout(t: torch.Tensor, transposed: bool) -> torch.Tensor:
    """Same values, non-contiguous: stored transposed, or every other column of a wider tensor."""
    if t.dim() < 2:
        return torch.stack([t, t]).T[:, 0] if transposed else t
    if transposed:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    wide = torch.stack([t, torch.zeros_like(t)], dim=-1).flatten(-2)
    return wide[..., ::2]


@dataclass(frozen=True)
class Case:
    """``call``: the op as ``"args: expression"`` (a lambda's text): the suite runs it, and a failure's
    standalone reproduction (``amp-harness repro``) writes the same text into its script."""

    name: str
    low_precision: bool  # True: autocast's lower-precision list; False: runs in fp32
    inputs: st.SearchStrategy[tuple[torch.Tensor, ...]]
    call: str
    budget: Callable[..., bd.Budget]  # (fp64 inputs..., fmt) -> Budget

    @property
    def args(self) -> list[str]:
        return [a.strip() for a in self.call.partition(":")[0].split(",")]

    @property
    def expression(self) -> str:
        return self.call.partition(":")[2].strip()

    def run(self, *inputs: torch.Tensor) -> torch.Tensor:
        # evaluated at each call, so a patched torch (the harness's negative controls) is what runs
        fn = eval(f"lambda {self.call}", {"torch": torch, "F": F})
        out: torch.Tensor = fn(*inputs)
        return out


layouts = st.booleans()
seeds = st.integers(0, 2**31 - 1)
scales = st.sampled_from(sorted(SCALES))


@st.composite
def _mm(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    m, k, n = draw(st.integers(1, 16)), draw(st.integers(1, 512)), draw(st.integers(1, 16))
    s, tr = draw(scales), draw(layouts)
    return _layout(_values(draw(seeds), (m, k), s), tr), _values(draw(seeds), (k, n), s)


@st.composite
def _linear(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    a, w = draw(_mm())
    return a, _layout(w.T.contiguous(), draw(layouts)), _values(draw(seeds), (w.shape[1],), draw(scales))


@st.composite
def _bmm(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    b, m, k, n = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 256)), draw(st.integers(1, 8))
    s = draw(scales)
    return _values(draw(seeds), (b, m, k), s), _layout(_values(draw(seeds), (b, k, n), s), draw(layouts))


@st.composite
def _conv(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    c, o, hw = draw(st.integers(1, 16)), draw(st.integers(1, 8)), draw(st.integers(3, 10))
    s = draw(scales)
    return _values(draw(seeds), (1, c, hw, hw), s), _values(draw(seeds), (o, c, 3, 3), s)


@st.composite
def _attn(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    n, d = draw(st.integers(1, 64)), draw(st.sampled_from([8, 16, 32, 64]))
    s = draw(st.sampled_from(["unit", "tiny"]))
    return tuple(_values(draw(seeds), (1, 2, n, d), s) for _ in range(3))


@st.composite
def _rows(draw: st.DrawFn, max_n: int = 2048, offsets: bool = True, near_max: bool = True) -> tuple[torch.Tensor, ...]:
    """Rows to reduce: long rows, large offsets (big activations), values near the fp16 maximum."""
    b, n = draw(st.integers(1, 4)), draw(st.integers(2, max_n))
    mode = draw(
        st.sampled_from(
            ["unit", "tiny", "huge", "mixed"]
            + (["offset"] if offsets else [])
            + (["near_fp16_max"] if near_max else [])
        )
    )
    if mode == "offset":
        x = _values(draw(seeds), (b, n), "unit", offset=draw(st.sampled_from([1e2, 1e3, 3e4])))
    elif mode == "near_fp16_max":
        x = _values(draw(seeds), (b, n), "unit") * 1e3 + 6e4
    else:
        x = _values(draw(seeds), (b, n), mode)
    return (_layout(x, draw(layouts)),)


@st.composite
def _ce(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    (x,) = draw(_rows(max_n=512, offsets=False))
    t = torch.randint(0, x.shape[1], (x.shape[0],), generator=torch.Generator().manual_seed(draw(seeds)))
    return x, t


@st.composite
def _pair(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    (a,) = draw(_rows(max_n=1024, offsets=False, near_max=False))
    return a, _values(draw(seeds), tuple(a.shape), draw(scales))


@st.composite
def _positive(draw: st.DrawFn, lo: float, hi: float) -> tuple[torch.Tensor, ...]:
    n = draw(st.integers(1, 256))
    g = torch.Generator().manual_seed(draw(seeds))
    return (torch.exp(torch.empty(n, dtype=torch.float64).uniform_(lo, hi, generator=g)).to(torch.float32),)


@st.composite
def _uniform(draw: st.DrawFn, lo: float, hi: float) -> tuple[torch.Tensor, ...]:
    n = draw(st.integers(1, 256))
    g = torch.Generator().manual_seed(draw(seeds))
    return (torch.empty(n, dtype=torch.float64).uniform_(lo, hi, generator=g).to(torch.float32),)


def _mm_budget(a: torch.Tensor, b: torch.Tensor, fmt: Any) -> bd.Budget:
    return bd.matmul_like(a, b, a.shape[-1], fmt, torch.matmul)


def _linear_budget(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, fmt: Any) -> bd.Budget:
    return bd.matmul_like(x, w.T, x.shape[-1], fmt, torch.matmul, bias=b)


def _conv_budget(x: torch.Tensor, w: torch.Tensor, fmt: Any) -> bd.Budget:
    return bd.matmul_like(x, w, w.shape[1] * 9, fmt, lambda a, b: F.conv2d(a, b))


def _groups(c: int) -> int:
    return 2 if c % 2 == 0 and c >= 4 else 1


def _group_norm_budget(x: torch.Tensor, fmt: Any) -> bd.Budget:
    n, c = x.shape
    g = _groups(c)
    b = bd.normalization(x.reshape(n, g, c // g), (2,), fmt, 1e-5)
    return bd.Budget(b.bound.reshape(n, c), f"group_norm as layer_norm per group: {b.origin}")


CASES = [
    Case("mm", True, _mm(), "a, b: torch.mm(a, b)", _mm_budget),
    Case("linear", True, _linear(), "x, w, b: F.linear(x, w, b)", _linear_budget),
    Case("bmm", True, _bmm(), "a, b: torch.bmm(a, b)", _mm_budget),
    Case("conv2d", True, _conv(), "x, w: F.conv2d(x, w)", _conv_budget),
    Case(
        "scaled_dot_product_attention",
        True,
        _attn(),
        "q, k, v: F.scaled_dot_product_attention(q, k, v)",
        lambda q, k, v, f: bd.attention(q, k, v, f),
    ),
    Case("softmax", False, _rows(), "x: F.softmax(x, -1)", lambda x, f: bd.softmax(x, -1, FP32)),
    Case("log_softmax", False, _rows(), "x: F.log_softmax(x, -1)", lambda x, f: bd.log_softmax(x, -1, FP32)),
    Case(
        "layer_norm",
        False,
        _rows(),
        "x: F.layer_norm(x, x.shape[-1:])",
        lambda x, f: bd.normalization(x, (-1,), FP32, 1e-5),
    ),
    Case(
        "group_norm",
        False,
        _rows(max_n=512),
        # groups: 2 where the channels split evenly into groups of at least 2, else 1 (_groups)
        "x: F.group_norm(x.unsqueeze(-1), 2 if x.shape[1] % 2 == 0 and x.shape[1] >= 4 else 1).squeeze(-1)",
        lambda x, f: _group_norm_budget(x, FP32),
    ),
    Case("cross_entropy", False, _ce(), "x, t: F.cross_entropy(x, t)", lambda x, t, f: bd.cross_entropy(x, t, FP32)),
    Case("mse_loss", False, _pair(), "a, b: F.mse_loss(a, b)", lambda a, b, f: bd.mse(a, b, FP32)),
    Case("sum", False, _rows(near_max=False), "x: x.sum(-1)", lambda x, f: bd.summation(x, -1, FP32)),
    Case(
        "cumsum",
        False,
        _rows(max_n=1024, near_max=False),
        "x: torch.cumsum(x, -1)",
        lambda x, f: bd.cumulative_sum(x, -1, FP32),
    ),
    Case("prod", False, _positive(-0.5, 0.5), "x: torch.prod(x)", lambda x, f: bd.product(x, FP32)),
    Case("exp", False, _uniform(-80, 80), "x: torch.exp(x)", lambda x, f: bd.elementwise(torch.exp(x), FP32, "exp")),
    Case("log", False, _positive(-30, 30), "x: torch.log(x)", lambda x, f: bd.elementwise(torch.log(x), FP32, "log")),
    Case(
        "pow",
        False,
        _positive(-10, 10),
        "x: torch.pow(x, 2.5)",
        lambda x, f: bd.elementwise(torch.pow(x, 2.5), FP32, "pow"),
    ),
    Case("norm", False, _rows(near_max=False), "x: torch.linalg.vector_norm(x)", lambda x, f: bd.vector_norm(x, FP32)),
]


def _reference(case: Case, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return case.run(*(t.to(torch.float64) if t.is_floating_point() else t for t in inputs))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_autocast_error_against_float64_is_within_the_derived_budget(case, amp_device, amp_dtype, amp_record):
    low = format_of(amp_dtype)
    with amp_record.property_run(
        f"{case.name}.error_over_budget",
        "|autocast - fp64| / derived budget, worst element",
        dtype=amp_dtype,
        device=amp_device,
    ) as tally:
        tally.bound, tally.unit = 1.0, "error/budget"

        @given(inputs=case.inputs)
        def prop(inputs: tuple[torch.Tensor, ...]) -> None:
            x64 = tuple(t.to(torch.float64) if t.is_floating_point() else t for t in inputs)
            budget = case.budget(*x64, low)
            ref = _reference(case, inputs)
            if case.low_precision:  # results beyond the format's range are overflow, not error
                assume(
                    bool(torch.isfinite(budget.bound).all()) and float(budget.bound.max() + ref.abs().max()) < low.max
                )
            with torch.autocast(amp_device.type, dtype=amp_dtype):
                got = case.run(*(t.to(amp_device) for t in inputs))
            what = f"{case.name} under autocast({amp_device.type}, {low.name})"
            result = compare_within(what, got, ref, budget.bound, budget.origin)
            tally.add(result.total, result.max_abs_diff, budget.origin)
            if not result.passed:  # the last failing example is hypothesis' shrunk one
                tally.repro = op_against_float64(
                    f"{what}: worst |autocast - float64| over its derived budget",
                    case.expression,
                    dict(zip(case.args, inputs, strict=True)),
                    budget.bound,
                    budget.origin,
                    autocast=(amp_device.type, amp_dtype),
                    device=str(amp_device),
                )
            assert result.passed, explain(result)

        prop()


# -- pitfall 1: why the fp32 fallbacks exist --------------------------------------------------
@dataclass(frozen=True)
class Pitfall:
    name: str
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    run: Callable[..., torch.Tensor]
    budget: Callable[..., bd.Budget]


def _logits() -> tuple[torch.Tensor, ...]:
    return (torch.linspace(11.1, 12.0, 64),)


def _activations() -> tuple[torch.Tensor, ...]:
    return (_values(1, (4, 768), "unit", offset=1000.0),)


def _long_positive() -> tuple[torch.Tensor, ...]:
    return (torch.rand(1, 4096, generator=torch.Generator().manual_seed(2)),)


def _attention_logits() -> tuple[torch.Tensor, ...]:
    return (_values(3, (4, 512), "unit") * 3,)


PITFALLS = [
    Pitfall("exp of logits above 11", _logits, torch.exp, lambda x: bd.elementwise(torch.exp(x), FP32, "exp")),
    Pitfall(
        "softmax of attention logits", _attention_logits, lambda x: F.softmax(x, -1), lambda x: bd.softmax(x, -1, FP32)
    ),
    Pitfall(
        "layer_norm of large activations",
        _activations,
        lambda x: F.layer_norm(x, x.shape[-1:]),
        lambda x: bd.normalization(x, (-1,), FP32, 1e-5),
    ),
    Pitfall(
        "long running sum", _long_positive, lambda x: torch.cumsum(x, -1), lambda x: bd.cumulative_sum(x, -1, FP32)
    ),
]


@pytest.mark.parametrize("pitfall", PITFALLS, ids=lambda p: p.name.replace(" ", "_"))
def test_fp32_list_ops_forced_into_low_precision_exceed_the_fp32_budget(pitfall, amp_device, amp_dtype, amp_record):
    """The danger is asserted, not printed: run in fp16/bf16 on realistic inputs, the op's error
    exceeds the fp32 budget (what autocast's fallback achieves); the ratio to autocast's error
    is recorded."""
    (x,) = pitfall.inputs()
    x64 = x.to(torch.float64)
    ref, budget = pitfall.run(x64), pitfall.budget(x64)
    with torch.autocast(amp_device.type, dtype=amp_dtype):
        autocast_out = pitfall.run(x.to(amp_device))
    forced = pitfall.run(x.to(amp_device, amp_dtype))
    safe = compare_within(f"{pitfall.name} (autocast)", autocast_out, ref, budget.bound, budget.origin)
    danger = compare_within(f"{pitfall.name} (forced {amp_dtype})", forced, ref, budget.bound, budget.origin)
    forced_ratio = danger.max_abs_diff or 0.0
    amp_record.require(safe, dtype=amp_dtype, device=amp_device)
    amp_record.require(
        compare_claim(
            f"pitfall.{pitfall.name}.forced_error_over_budget",
            forced_ratio,
            not danger.passed,
            f"forced into {amp_dtype} the op breaks the fp32 budget (error/budget > 1): {budget.origin}",
            detail=[
                f"{pitfall.name}: forced into {amp_dtype} the op stayed within the fp32 budget (worst error/budget "
                f"{forced_ratio:.3g} <= 1), so this input shows no danger and the pitfall check is not sensitive:",
                *explain(danger).splitlines(),
            ],
            allowance=1.0,
        ),
        dtype=amp_dtype,
        device=amp_device,
        tags={"autocast_error_over_budget": safe.max_abs_diff},
    )
