"""The autocast policy's claims, standalone: the aten ops registered for an autocast dispatch key
against a golden list, the ops PyTorch's autocast test lists name against those the harness's
catalogue reaches, each op under autocast against the same calls on inputs cast by hand, and
each op's behaviour (decided from fp32, low-precision and mixed inputs) against how PyTorch's
lists file it.

amp-harness writes a failed check's captured calls (``case_<i>`` functions and their saved
inputs) and values over the defaults below and keeps the blocks it needs
(``harness.domains.autocast.repro``); as it lies here each judgement runs on two CPU ops.
"""

import ast
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

# -- registered_ops --
KEY = "AutocastCPU"  # the dispatch key
MISSING_ONLY = True  # True: only ops registered but missing from EXPECTED count (the catalogue's reach)
# reference: the golden list of this torch release, or the ops the catalogue reaches
EXPECTED = ["aten::mm", "aten::matmul", "aten::linear"]
ops = sorted(n for n in torch._C._dispatch_get_all_op_names() if torch._C._dispatch_has_kernel_for_dispatch_key(n, KEY))
new = sorted(set(ops) - set(EXPECTED))
gone = [] if MISSING_ONLY else sorted(set(EXPECTED) - set(ops))
print("registered but not reached:" if MISSING_ONLY else "newly registered:", new)
if not MISSING_ONLY:
    print("no longer registered:", gone)
measured = len(new) + len(gone)  # ops unlike the list
allowed = 0

# -- banned --
DEVICE = "cpu"  # the autocast device (binary_cross_entropy is banned under CUDA autocast)
DTYPE = torch.float16  # the autocast dtype
p, t = (
    torch.rand(4, generator=torch.Generator().manual_seed(0)),
    torch.rand(4, generator=torch.Generator().manual_seed(1)),
)
try:
    with torch.autocast(DEVICE, dtype=DTYPE):
        outcome = f"returned {torch.nn.functional.binary_cross_entropy(p.to(DEVICE), t.to(DEVICE)).dtype}"
except RuntimeError as exc:
    outcome = (str(exc).strip().splitlines() or [""])[0]
print(f"binary_cross_entropy under {DEVICE} autocast ({DTYPE}): {outcome}")
# reference: autocast refuses it, saying so (PyTorch's autocast_mode.cpp), pointing to the logits form
measured = int("unsafe to autocast" not in outcome)  # 1: it ran, or raised something else
allowed = 0

# -- fast_path --
FAST_DEVICE = "cpu"  # the autocast device
FAST_DTYPE = torch.bfloat16  # the autocast dtype
MODULE = "TransformerEncoderLayer"  # TransformerEncoderLayer, TransformerEncoderLayer.norm_first or MultiheadAttention
torch.manual_seed(0)
if MODULE == "MultiheadAttention":
    fast_module: torch.nn.Module = torch.nn.MultiheadAttention(32, 4, batch_first=True)
else:
    norm_first = MODULE.endswith("norm_first")
    fast_module = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first)
fast_module = fast_module.to(FAST_DEVICE).eval()
fast_x = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(0)).to(FAST_DEVICE)
try:
    with torch.inference_mode(), torch.autocast(FAST_DEVICE, dtype=FAST_DTYPE):  # eval, no autograd: the fast path
        if MODULE == "MultiheadAttention":
            fast_out = fast_module(fast_x, fast_x, fast_x, need_weights=False)[0]
        else:
            fast_out = fast_module(fast_x)
    fast_outcome = "finite" if bool(fast_out.isfinite().all()) else "non-finite values"
except RuntimeError as exc:
    fast_outcome = "raised: " + (str(exc).strip().splitlines() or [""])[0]
print(f"{MODULE} inference under {FAST_DEVICE} autocast ({FAST_DTYPE}): {fast_outcome}")
# reference: the fused inference path runs under autocast and gives finite values
measured = int(fast_outcome != "finite")  # 1: it raised or gave non-finite values
allowed = 0

# -- coverage --
LISTS_FILE: str | None = None  # the lists file the check was given (None: the installed torch's)
CLASS = "AutocastCPUTestLists"  # the class of the device's lists
DEVICE_TYPE = "cpu"
LISTS = ["fp32", "torch_16", "nn_16", "torch_fp32", "nn_fp32"]  # the lists of ops with an expected behaviour
# reference: the ops the harness's catalogue reaches (or explains), as the check found them
REACHED = ["conv1d", "mm", "matmul", "layer_norm"]
if LISTS_FILE is not None:
    path = Path(LISTS_FILE)
else:
    spec: Any = importlib.util.find_spec("torch")  # the installed torch's lists
    path = Path(next(iter(spec.submodule_search_locations))) / "testing" / "_internal" / "autocast_test_lists.py"
cls = next(n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == CLASS)
listed = {
    str(e.elts[0].value)
    for n in ast.walk(cls)
    if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Attribute) and n.targets[0].attr in LISTS
    for e in getattr(n.value, "elts", [])
    if isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant)
}
unreached = sorted(listed - set(REACHED))
print(f"{path.name} ({len(listed)} ops for {DEVICE_TYPE}): not reached by the harness's catalogue: {unreached}")
measured = len(unreached)  # listed ops without a catalogue row
allowed = 0

# -- cases --
# the default's captured calls: a matrix product and a softmax, on their saved inputs
_gen = torch.Generator().manual_seed(0)
c0_x0, c0_x1, c1_x0 = (torch.randn(4, 4, generator=_gen) for _ in range(3))


def case_0(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    return torch.mm(x0, x1)


def case_1(x0: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x0, -1)


# -- hand_cast --
DEVICE = "cpu"
DTYPE = torch.bfloat16  # the autocast dtype
Run = Callable[..., Any]
CASES: list[tuple[str, Run, list[torch.Tensor]]] = [
    ("torch.mm", case_0, [c0_x0, c0_x1]),
    ("torch.softmax", case_1, [c1_x0]),
]
measured = 0
for label, run, inputs in CASES:
    torch.manual_seed(0)
    with torch.autocast(DEVICE, dtype=DTYPE):
        got = run(*inputs)
    # reference: autocast's own rule, cast the inputs by hand and run the op without autocast
    by_hand = [t.to(got.dtype) if t.is_floating_point() else t for t in inputs]
    torch.manual_seed(0)
    with torch.autocast(DEVICE, enabled=False):
        ref = run(*by_hand)
    same = (
        got.dtype == ref.dtype and got.shape == ref.shape and bool(((got == ref) | (got.isnan() & ref.isnan())).all())
    )
    worst = (got.double() - ref.double()).abs().nan_to_num(0.0).max().item() if got.shape == ref.shape else None
    said = "bitwise equal" if same else f"differ (max |diff| {worst})"
    print(f"{label}: autocast {got.dtype}, by hand {ref.dtype}, {said}")
    measured += not same  # ops unlike their hand-cast run
allowed = 0

# -- observe --


def observe(run: Run, inputs: Sequence[torch.Tensor]) -> str:  # the output dtype under autocast, or the error
    torch.manual_seed(0)  # random ops draw what they drew when the check ran
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = run(*inputs)
    except RuntimeError as exc:
        return "raises: " + (str(exc).strip().splitlines() or [""])[0]
    return "no error" if out is None else str(out.dtype).removeprefix("torch.")


# -- categories --
LOW = "bfloat16"  # the autocast dtype's name


def behaves_as(seen: dict[str, str]) -> str:
    """The autocast list the observations show (the harness's rule, written out)."""
    if seen["fp32_in"].startswith("raises"):
        return "raises"
    if seen["fp32_in"] == LOW:
        return "lower_precision"
    if seen.get("lowp_in") == "float32":
        return "fp32"
    if seen.get("mixed_in") == "float32":
        return "widest_input"
    return "follows_input"


# reference: how PyTorch's own autocast test lists file each op, and the behaviour each filing accepts
FILED: list[tuple[str, dict[str, tuple[Run, list[torch.Tensor]]], str, list[str]]] = [
    ("mm (mm)", {"fp32_in": (case_0, [c0_x0, c0_x1])}, "lower_precision", ["lower_precision"]),
    ("softmax (softmax)", {"fp32_in": (case_1, [c1_x0])}, "fp32", ["fp32", "follows_input"]),
]
measured = 0
for label, runs, filed_as, accepted in FILED:
    seen = {kind: observe(run, inputs) for kind, (run, inputs) in runs.items()}
    behaviour = behaves_as(seen)
    differs = "" if behaviour in accepted else "   <- differs"
    print(f"{label}: behaves as {behaviour} {seen}; PyTorch's lists say {filed_as}{differs}")
    measured += behaviour not in accepted  # ops unlike their filing
allowed = 0
