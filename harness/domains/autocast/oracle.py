"""PyTorch's own autocast test lists as an independent oracle for the observed policy.

Every torch wheel, the CPU build included, ships ``torch/testing/_internal/autocast_test_lists.py``:
PyTorch's expectations of which ops autocast runs in low precision, which in fp32, which promote
and which are banned, for CUDA (``AutocastTestLists``) and CPU (``AutocastCPUTestLists``). The
file is read as text (``ast``), not imported: importing it needs test-only packages and builds
tensors on the device, while the op names are all the oracle needs. So the CUDA expectations are
known on a machine without a GPU, and judge the CUDA table on its very first run.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import torch

from harness.domains.engines.ops.catalogue import CATALOGUE, INTERNAL_OPS, OpCase
from harness.domains.engines.ops.probe import Category, Probe
from harness.domains.versions import minor
from harness.numerics.comparison import ClaimComparison, compare_claim


class Expectation(Enum):
    LOWER_PRECISION = "lower precision"
    FP32 = "fp32"
    #: autocast's promote list: mixed inputs run in the widest dtype
    PROMOTE = "promote"
    #: the op promotes by itself; autocast leaves it alone
    BUILTIN_PROMOTE = "builtin promote"
    BANNED = "banned"


#: Which list means what, in both classes of the upstream file.
LISTS: dict[str, Expectation] = {
    "torch_fp16": Expectation.LOWER_PRECISION,
    "torch_16": Expectation.LOWER_PRECISION,
    "nn_fp16": Expectation.LOWER_PRECISION,
    "nn_16": Expectation.LOWER_PRECISION,
    "linalg_fp16": Expectation.LOWER_PRECISION,
    "methods_fp16": Expectation.LOWER_PRECISION,
    "torch_fp32": Expectation.FP32,
    "nn_fp32": Expectation.FP32,
    "methods_fp32": Expectation.FP32,
    "torch_need_autocast_promote": Expectation.PROMOTE,
    "torch_expect_builtin_promote": Expectation.BUILTIN_PROMOTE,
    "methods_expect_builtin_promote": Expectation.BUILTIN_PROMOTE,
    "banned": Expectation.BANNED,
}
CLASSES = {"cuda": "AutocastTestLists", "cpu": "AutocastCPUTestLists"}

#: The categories the probe may observe for an op that PyTorch files under an expectation.
ACCEPTED: dict[Expectation, frozenset[Category]] = {
    Expectation.LOWER_PRECISION: frozenset({Category.LOWER_PRECISION}),
    Expectation.FP32: frozenset({Category.FP32}),
    Expectation.PROMOTE: frozenset({Category.WIDEST_INPUT}),
    # comparisons give bool whatever the inputs: following the inputs is promotion done right
    Expectation.BUILTIN_PROMOTE: frozenset({Category.WIDEST_INPUT, Category.FOLLOWS_INPUT}),
    Expectation.BANNED: frozenset({Category.RAISES}),
}

#: Upstream ops the catalogue cannot call through a public API as a tensor-valued op, and why.
NOT_CALLABLE: dict[str, str] = {
    "equal": "torch.equal returns a Python bool: there is no output dtype to observe",
}


@dataclass(frozen=True)
class KnownDisagreement:
    """A measured difference between the observed policy and PyTorch's list, registered as a
    finding of the torch releases in ``affected`` (minor versions) and the autocast ``dtypes``."""

    affected: tuple[str, ...]
    dtypes: tuple[str, ...]
    summary: str


#: (device type, catalogue case) -> the finding. Filled from measurements, never to make a test pass
#: silently: an entry whose disagreement disappears fails until it is removed.
KNOWN_DISAGREEMENTS: dict[tuple[str, str], KnownDisagreement] = {}


def registered(device_type: str, torch_minor: str, dtype: str) -> dict[str, KnownDisagreement]:
    """The findings registered for this device type, torch release (``2.13``) and autocast dtype,
    by catalogue case."""
    return {
        case: finding
        for (dev, case), finding in KNOWN_DISAGREEMENTS.items()
        if dev == device_type and torch_minor in finding.affected and dtype in finding.dtypes
    }


def installed_lists() -> Path:
    """The lists file of the installed torch."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "testing" / "_internal" / "autocast_test_lists.py"


class OracleSourceError(Exception):
    """The lists file is missing or no longer has the shape the oracle reads; says which."""


def read_lists(device_type: str, source: Path | None = None) -> dict[str, Expectation]:
    """Upstream op name -> PyTorch's expectation for ``device_type`` (``cpu`` or ``cuda``)."""
    path = source or installed_lists()
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError) as exc:
        raise OracleSourceError(f"{path}: cannot read PyTorch's autocast test lists ({exc})") from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASSES[device_type]), None)
    if cls is None:
        raise OracleSourceError(f"{path}: no class {CLASSES[device_type]} (has torch reorganised its autocast tests?)")
    out: dict[str, Expectation] = {}
    for node in ast.walk(cls):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.List)):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Attribute) and target.attr in LISTS):
            continue
        for entry in node.value.elts:
            if isinstance(entry, ast.Tuple) and entry.elts and isinstance(entry.elts[0], ast.Constant):
                out.setdefault(str(entry.elts[0].value), LISTS[target.attr])
    if not out:
        raise OracleSourceError(f"{path}: {CLASSES[device_type]} lists no ops the oracle recognises")
    return out


def aten_name(upstream: str) -> str:
    """``__matmul__`` -> ``matmul``: the aten op a Tensor method reaches."""
    return upstream.removeprefix("__").removesuffix("__") if upstream.startswith("__") else upstream


def cases_for(upstream: str, device_type: str, cases: Iterable[OpCase] = CATALOGUE) -> list[OpCase]:
    name = aten_name(upstream)
    return [c for c in cases if name in c.aten and device_type in c.devices]


def explained(upstream: str) -> bool:
    """An op the catalogue need not call: reached through another API (INTERNAL_OPS) or with no
    output dtype to observe (NOT_CALLABLE)."""
    return aten_name(upstream) in INTERNAL_OPS or upstream in NOT_CALLABLE


def uncovered(expectations: Mapping[str, Expectation], device_type: str) -> list[str]:
    """Listed ops the catalogue does not reach on ``device_type`` and no table explains."""
    return sorted(op for op in expectations if not cases_for(op, device_type) and not explained(op))


@dataclass(frozen=True)
class Disagreement:
    """An op whose observed policy differs from PyTorch's list: both sides, for a finding."""

    upstream_op: str
    case: str
    expected: Expectation
    observed: Category
    probe: Probe

    def describe(self) -> str:
        return (
            f"{self.case} ({self.upstream_op}): PyTorch's list says {self.expected.value}, "
            f"observed {self.observed.value} ({self.probe.as_baseline()})"
        )


@dataclass(frozen=True)
class OracleResult:
    checked: int
    agreements: int
    disagreements: tuple[Disagreement, ...]
    #: upstream ops the catalogue does not reach and no table explains
    uncovered: tuple[str, ...]


def judge(
    expectations: Mapping[str, Expectation],
    table: Mapping[str, Probe],
    device_type: str,
    dtype: torch.dtype,
    cases: Iterable[OpCase] = CATALOGUE,
) -> OracleResult:
    """Every listed op the catalogue can call, against its expectation on this device and dtype."""
    cases = list(cases)
    checked = agree = 0
    found: list[Disagreement] = []
    missing: list[str] = []
    for op, expected in sorted(expectations.items()):
        mine = [c for c in cases_for(op, device_type, cases) if c.name in table]
        if not mine:
            if not explained(op):
                missing.append(op)
            continue
        for case in mine:
            checked += 1
            observed = table[case.name].category(dtype)
            if observed in ACCEPTED[expected]:
                agree += 1
            else:
                found.append(Disagreement(op, case.name, expected, observed, table[case.name]))
    return OracleResult(checked, agree, tuple(found), tuple(missing))


# -- the claims: coverage and agreement, decided here ------------------------------------------------
def coverage_claim(device_type: str, uncovered: Sequence[str]) -> ClaimComparison:
    """Every op of PyTorch's own autocast lists for ``device_type`` is called by the catalogue, or
    INTERNAL_OPS / NOT_CALLABLE says why it cannot be (``uncovered``: :func:`uncovered`)."""
    return compare_claim(
        f"upstream_lists.{device_type}.uncovered",
        len(uncovered),
        not uncovered,
        f"every op of PyTorch's {CLASSES[device_type]} is called by the catalogue, or "
        "INTERNAL_OPS / NOT_CALLABLE says why it cannot be",
        detail=f"not reached: {', '.join(uncovered)}; add a row to harness/domains/engines/ops/catalogue.py",
        expected=0,
        allowance=0,
        unit="ops",
    )


def disagreements_claim(
    device_type: str,
    unexplained: Sequence[Disagreement],
    findings: Mapping[str, object],
    disagreements: Sequence[Disagreement],
) -> ClaimComparison:
    """Every listed op behaves as PyTorch's lists expect, or its difference is a registered
    finding of this release; a registered finding that no longer disagrees fails too (remove it)."""
    fixed = sorted(set(findings) - {d.case for d in disagreements})
    return compare_claim(
        f"upstream_lists.{device_type}.disagreements",
        len(unexplained),
        not unexplained and not fixed,
        f"every listed op behaves as PyTorch's {CLASSES[device_type]} expects, or the difference "
        "is a registered finding of this torch release (KNOWN_DISAGREEMENTS)",
        detail=[
            *(d.describe() for d in unexplained),
            *(
                f"{case}: registered as disagreeing in torch {minor(torch.__version__)}, but agrees now: remove it from "
                "KNOWN_DISAGREEMENTS in harness/domains/autocast/oracle.py"
                for case in fixed
            ),
        ],
        expected=0,
        allowance=0,
        unit="ops",
    )


def registered_coverage_claim(device_type: str, registered: set[str], missing: Sequence[str]) -> ClaimComparison:
    """Every op registered for this device's autocast dispatch key is reached by the catalogue
    (``missing``: those it does not reach)."""
    return compare_claim(
        f"catalogue_coverage.{device_type}",
        len(registered) - len(missing),
        not missing,
        "every registered autocast op is reached by the catalogue (harness.domains.engines.ops.catalogue.CATALOGUE)",
        detail=f"{len(missing)} op(s) registered for Autocast{device_type.upper()} in torch {torch.__version__} are "
        f"not in the catalogue: {', '.join(missing)}. Add a row calling each through its public API to "
        "harness/domains/engines/ops/catalogue.py (or to INTERNAL_OPS, naming the public API that reaches it).",
        expected=len(registered),
        allowance=0,
        unit="ops",
    )
