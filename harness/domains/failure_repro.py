"""Standalone reproductions of failed checks: what a check saw when it failed, written so that
``amp-harness repro`` can turn it into a script that needs only torch (and the library concerned).

A check that fails attaches a :class:`FailureRepro` to its row: the failing example's tensors
(saved exactly, beside the run report), the computation under test and its independent reference
as source text, and the allowance with its origin. The script :func:`render` writes seeds nothing
and draws nothing: it loads the very inputs the check failed on, so it shows the same numbers on
the same stack. Its last line prints measured against allowed and exits 1 while the defect is
present (``measured > allowed``, or not a number), 0 once fixed, 2 if it could not run.

Families, one builder each: an op against float64 (autocast numerics), captured calls under
autocast against their expected dtypes, the hand-cast run or PyTorch's lists (autocast policy,
with :mod:`harness.domains.call_capture`), one aten op of a training step against itself in
float64, a loss-scaler trace or the state machine's rules against the scaler's rule, a
third-party scaler's conformance example against its release's rule, one optimizer
step under GradScaler against its float64 update or a skip, fp8 scales,
casts and format limits against their exact definitions, stochastic rounding against the binomial
law of its draws, and
(``harness.domains.compiled.runs.repro_of``) the compiled probe block. A check of another kind
records no reproduction; ``amp-harness repro`` says so and prints the rerun command.
"""

from __future__ import annotations

import io
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.domains.call_capture import Captured
from harness.numerics.formats import format_of

#: A tensor this small is written into the script itself; a larger one is saved beside it.
INLINE_ELEMENTS = 64


@dataclass(frozen=True)
class FailureRepro:
    """One failed check, reproducible without the harness. ``code`` runs after the inputs are
    defined (each tensor by its name) and must set ``measured`` and ``allowed``; ``what`` says what
    is measured, ``allowance`` where the allowance comes from."""

    family: str
    what: str
    code: str
    allowance: str
    tensors: Mapping[str, torch.Tensor] = field(default_factory=dict)
    needs: tuple[str, ...] = ("torch",)
    device: str = "cpu"

    def spec(self, attachment: str | None) -> dict[str, Any]:
        """What the row keeps (JSON): everything but the tensors, which ``attachment`` names."""
        return {
            "family": self.family,
            "what": self.what,
            "code": self.code,
            "allowance": self.allowance,
            "needs": list(self.needs),
            "device": self.device,
            "tensors": {k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in self.tensors.items()},
            "attachment": attachment,
        }

    def tensor_bytes(self) -> bytes:
        """The tensors, saved exactly (``torch.save`` of a dict, CPU)."""
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu().clone() for k, v in self.tensors.items()}, buf)
        return buf.getvalue()


def load_tensors(data: bytes) -> dict[str, torch.Tensor]:
    loaded = torch.load(io.BytesIO(data), weights_only=True)
    return {str(k): v for k, v in loaded.items()}


def _literal(name: str, t: torch.Tensor, device: str) -> str:
    """``name = torch.tensor([...])``, exact: float64 reprs round-trip, and every narrower float is
    a float64 exactly."""
    dtype = str(t.dtype)
    values = t.detach().cpu().double().flatten().tolist() if t.is_floating_point() else t.flatten().tolist()
    body = ", ".join("float('nan')" if v != v else repr(v).replace("inf", "float('inf')") for v in values)
    src = f"torch.tensor([{body}], dtype=torch.float64)" if t.is_floating_point() else f"torch.tensor([{body}])"
    to = f".to({dtype})" if t.dtype != torch.float64 else ""
    dev = f'.to("{device}")' if device != "cpu" else ""
    return f"{name} = {src}.reshape({tuple(t.shape)!r}){to}{dev}"


def render(
    spec: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], header: list[str], inputs_file: str | None
) -> str:
    """The script: ``header`` (comment lines), the could-not-run hook, imports, the inputs (inline
    when small, else loaded from ``inputs_file`` beside the script), the check's code, the verdict."""
    from harness.domains.reproductions import COULD_NOT_RUN

    device = str(spec.get("device", "cpu"))
    lines = ["# " + h if h else "#" for h in header]
    code = str(spec["code"]).rstrip("\n")
    imports = ["import math", "", "import torch"] + (["import torch.nn.functional as F"] if "F." in code else [])
    out = ["\n".join(lines), "", COULD_NOT_RUN.rstrip("\n"), "", *imports, ""]
    if tensors:
        out.append("# the inputs the check failed on, exactly")
    if tensors and not needs_file(tensors):
        out += [_literal(k, v, device) for k, v in tensors.items()]
    elif tensors:
        if inputs_file is None:
            raise ValueError("tensors too large to inline need an inputs file beside the script")
        dev = f'.to("{device}")' if device != "cpu" else ""
        out += [
            "from pathlib import Path",
            "",
            f"_inputs = torch.load(Path(__file__).with_name({inputs_file!r}), weights_only=True)",
            *(f"{k} = _inputs[{k!r}]{dev}" for k in tensors),
        ]
    two_blank_lines = tensors and code.startswith(("def ", "class "))  # a definition after the inputs
    out += ["", "", code, ""] if two_blank_lines else ["", code, ""]
    what, allowance = str(spec["what"]), str(spec["allowance"])
    out += [
        f'print({what!r} + f": measured {{measured!r}}, allowed {{allowed!r}}")',  # what: text, not a format
        f"print({('allowance: ' + allowance).__repr__()})",
        "_sys.exit(0 if measured <= allowed else 1)  # NaN is not <=: a defect",
        "",
    ]
    return "\n".join(out)


def needs_file(tensors: Mapping[str, torch.Tensor]) -> bool:
    return sum(t.numel() for t in tensors.values()) > INLINE_ELEMENTS


# -- the families -------------------------------------------------------------------------------
def _dtype(dtype: torch.dtype) -> str:
    return str(dtype)


def _upcast(tensors: Mapping[str, torch.Tensor]) -> str:
    """Source rebinding each floating input to itself upcast exactly to float64."""
    names = ", ".join(tensors) + ("," if len(tensors) == 1 else "")
    values = ", ".join(f"{k}.double() if {k}.is_floating_point() else {k}" for k in tensors)
    return f"{names} = ({values}{',' if len(tensors) == 1 else ''})"


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
        run = f'with torch.autocast("{autocast[0]}", dtype={_dtype(autocast[1])}):\n    got = {call}'
    code = f"""{run}
# reference: the same computation on the same inputs upcast exactly to float64
{_upcast(tensors)}
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


def op_local_error(
    what: str,
    call: str,
    tensors: Mapping[str, torch.Tensor],
    unit_dtype: torch.dtype,
    budget_u: float,
    origin: str,
    *,
    device: str = "cpu",
    cast: bool = False,
) -> FailureRepro:
    """One aten op of a training step, on the inputs it saw, against itself in float64: its local
    error ``max |out - ref| / max |ref|`` in units of ``unit_dtype``'s unit roundoff (the op's
    output format, or the recipe's where the output's is narrower). ``cast``: a cast, whose exact
    result is its input (``t0``)."""
    u = format_of(unit_dtype).unit_roundoff
    reference = (
        "# reference: a cast's exact result is its input\nref = t0.double()"
        if cast
        else f"""# reference: the same op on the same inputs upcast exactly to float64
{_upcast(tensors)}
ref = {call}
ref = ref[0] if isinstance(ref, (tuple, list)) else ref"""
    )
    code = f"""got = {call}
got = got[0] if isinstance(got, (tuple, list)) else got  # an op with several outputs: the first
{reference}
U = {u!r}  # unit roundoff of {str(unit_dtype).removeprefix("torch.")}
measured = float((got.double() - ref).abs().max() / ref.abs().max()) / U  # the op's own error, in u
allowed = {budget_u!r}"""
    return FailureRepro("op", what, code, origin, dict(tensors), device=device)


def scaler_trace(
    what: str,
    scaler_cls: str,
    growth_interval: int,
    inject_at: Sequence[int],
    steps: int,
    where: str,
) -> FailureRepro | None:
    """The fp16 loss-scaler trace with overflows injected at the steps ``inject_at`` (the scaler
    suite's trainer), against the scaler's rule written out: backoff x0.5 and skip on overflow, x2
    after ``growth_interval`` clean steps. None when ``scaler_cls`` (module.qualname) cannot be
    imported standalone."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module or "<" in qualname or not (module == "torch" or module.startswith("torch.")):
        return None
    inject = {
        "forward": (
            "        if s in INJECT_AT:\n            h = h * (65504.0 * 4)  # fp16 activations beyond 65504\n",
            "",
            "",
        ),
        "loss": ("", "    if s in INJECT_AT:\n        loss = loss * math.inf\n", ""),
        "backward": (
            "",
            "",
            "    if s in INJECT_AT:\n        l2.weight.grad.view(-1)[0] = math.inf  # one scaled gradient\n",
        ),
    }
    if where not in inject:
        return None
    fwd, lss, bwd = inject[where]
    group = (
        "import torch.distributed as dist\n\n"
        'dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # the scaler needs one\n'
        if "Sharded" in qualname
        else ""
    )
    code = f"""import {module}
{group}
GROWTH_INTERVAL, INJECT_AT, STEPS = {growth_interval}, {set(inject_at)!r}, {steps}  # overflows at INJECT_AT
torch.manual_seed(0)
l1, l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 1)
params = [*l1.parameters(), *l2.parameters()]
opt = torch.optim.AdamW(params, lr=1e-2)
scaler = {scaler_cls}("cpu", growth_interval=GROWTH_INTERVAL)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(32, 8, generator=g), torch.randn(32, 1, generator=g)
got = []
for s in range(STEPS):
    opt.zero_grad()
    before = [p.detach().clone() for p in params]
    scale = scaler.get_scale()
    with torch.autocast("cpu", dtype=torch.float16):
        h = torch.relu(l1(x))
{fwd}        loss = torch.nn.functional.mse_loss(l2(h).float(), y)
{lss}    scaler.scale(loss).backward()
{bwd}    scaler.step(opt)
    scaler.update()
    got.append((s, scale, all(torch.equal(b, p) for b, p in zip(before, params))))
# reference: the rule written out (init 2^16; overflow: skip, x0.5, restart the count; else x2 after
# GROWTH_INTERVAL clean steps in a row)
expected, scale, clean = [], 2.0**16, 0
for s in range(STEPS):
    overflow = s in INJECT_AT
    expected.append((s, scale, overflow))
    scale, clean = (scale * 0.5, 0) if overflow else ((scale * 2.0, 0) if clean + 1 == GROWTH_INTERVAL else (scale, clean + 1))
for g_, e_ in zip(got, expected):
    if g_ != e_:
        print(f"step {{g_[0]}}: scale {{g_[1]}} skipped={{g_[2]}}; expected scale {{e_[1]}} skipped={{e_[2]}}")
measured = sum(g_ != e_ for g_, e_ in zip(got, expected))  # steps whose scale or skip differ
allowed = 0"""
    return FailureRepro("scaler", what, code, "exact: the trace is deterministic, the rule integral")


def fp8_scales(
    what: str, x: torch.Tensor, fp8_dtype: torch.dtype, fp8_max: float, axis: int | None, power_of_2: bool
) -> FailureRepro:
    """torchao's fp8 scales of ``x`` against their definition, fp8_max / max(amax, 1e-12) in float64
    rounded once to float32 (power of two: the largest not above it, from the bits)."""
    gran = "TENSORWISE" if axis is None else "AXISWISE"
    amax = "x.double().abs().max()" if axis is None else f"x.double().abs().amax(dim={axis}, keepdim=True)"
    pow2 = (
        "\nref = torch.tensor([math.ldexp(1.0, math.frexp(v)[1] - 1) if 0 < v < math.inf else v for v in "
        "ref.flatten().tolist()]).reshape(ref.shape)  # the power of two at or below it"
        if power_of_2
        else ""
    )
    code = f"""from torchao.float8 import config, float8_utils

got = float8_utils.tensor_to_scale(
    x, {_dtype(fp8_dtype)}, scaling_granularity=config.ScalingGranularity.{gran},
    axiswise_dim={axis!r}, round_scales_to_power_of_2={power_of_2!r},
)
# reference: the definition, in float64 (amax of a float32 tensor is exact)
FP8_MAX = {fp8_max!r}  # the format's largest finite value
exact = FP8_MAX / torch.clamp({amax}, min=1e-12)  # inf amax: 0; NaN: NaN
ref = exact.float()  # rounded once more to float32: as rounding the exact quotient once (53 >= 2 x 24 + 2){pow2}
pairs = list(zip(got.float().flatten().tolist(), ref.flatten().tolist()))
differ = [(i, g_, r_) for i, (g_, r_) in enumerate(pairs) if g_ != r_ and not (g_ != g_ and r_ != r_)]
for i, g_, r_ in differ:
    print(f"scale {{i}}: torchao {{g_!r}}, by definition {{r_!r}}")
measured = len(differ) if got.numel() == ref.numel() else math.inf  # scales unlike their definition
allowed = 0"""
    return FailureRepro(
        "fp8", what, code, "exact: the scale is defined to one float32 rounding", {"x": x}, ("torch", "torchao")
    )


def cast_rounding(what: str, values: torch.Tensor, dtype: torch.dtype) -> FailureRepro:
    """torch's cast of float32 ``values`` to ``dtype`` against round-to-nearest-even written out in
    exact rationals from the format's precision, minimum exponent and largest finite value (values
    the format leaves to the implementation, overflow without inf, are not among them)."""
    fmt = format_of(dtype)
    ieee = fmt.encoding.value == "ieee"
    code = f"""from fractions import Fraction

got = x.to({_dtype(dtype)}).float().tolist()
# reference: IEEE round-to-nearest-even, exactly (Python integers and fractions), from the format
P, EMIN, MAX = {fmt.precision}, {fmt.emin}, {fmt.max!r}  # {fmt.name}: significand bits, min exponent, max finite


def rne(v):
    if v != v or v in (0.0, math.inf, -math.inf):
        return v
    a = Fraction(abs(v))
    e = a.numerator.bit_length() - a.denominator.bit_length()  # floor(log2 a), or one more
    if Fraction(2) ** e > a:
        e -= 1
    q = Fraction(2) ** (max(e, EMIN) - (P - 1))  # the spacing of the format's values near a
    k, r = divmod(a, q)
    k = int(k) + (1 if r > q / 2 or (r == q / 2 and int(k) % 2 == 1) else 0)
    out = float(k * q)
    if out > MAX:
        out = {"math.inf" if ieee else "math.nan"}  # {"beyond the largest finite value: inf" if ieee else "no inf in this format"}
    return math.copysign(out, v)


ref = [rne(v) for v in x.tolist()]
differ = [
    (v, g_, r_)
    for v, g_, r_ in zip(x.tolist(), got, ref)
    if not (g_ == r_ and math.copysign(1, g_) == math.copysign(1, r_)) and not (g_ != g_ and r_ != r_)
]
for v, g_, r_ in differ[:8]:
    print(f"cast of {{v!r}}: torch {{g_!r}}, round-to-nearest-even {{r_!r}}")
measured = len(differ)  # values cast otherwise than round-to-nearest-even
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: IEEE 754 round-to-nearest-even", {"x": values})


def header(
    spec: Mapping[str, Any], nodeid: str, metric: str, run: str, provenance: str, rerun: str, script: str
) -> list[str]:
    """The script's header: what failed, where it was produced, how to rerun the check itself."""
    wrap = textwrap.TextWrapper(width=96, break_on_hyphens=False, break_long_words=False)
    return [
        f"Reproduces a failed amp-harness check: {metric} (run {run}), of",
        f"  {nodeid}",
        *wrap.wrap(f"Produced on: {provenance}."),
        *wrap.wrap(f"What is measured: {spec['what']}."),
        f"Needs only {' and '.join(spec.get('needs', ['torch']))}. Run: python {script}",
        "Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.",
        "The check itself, with the harness:",
        f"  {rerun}",
    ]


# -- calls kept as source (harness.domains.call_capture) ----------------------------------------
def _cases(captures: Sequence[tuple[str, Captured]]) -> tuple[list[str], list[str], dict[str, torch.Tensor]]:
    """Each capture as a function ``case_i`` and the call of it on its saved inputs ``ci_x0, ...``."""
    defs, calls, tensors = [], [], {}
    for i, (_label, cap) in enumerate(captures):
        defs.append(cap.function(f"case_{i}"))
        tensors.update({f"c{i}_{k}": v for k, v in cap.tensors.items()})
        calls.append(f"case_{i}, [{', '.join(f'c{i}_{k}' for k in cap.tensors)}]")
    return defs, calls, tensors


def _observe(device: str, dtype: torch.dtype) -> str:
    """Source of ``observe(run, inputs)``: the output dtype's name under autocast, or the error."""
    return f"""def observe(run, inputs):
    torch.manual_seed(0)  # random ops draw what they drew when the check ran
    try:
        with torch.autocast({device.split(":")[0]!r}, dtype={_dtype(dtype)}):
            out = run(*inputs)
    except RuntimeError as exc:
        return "raises: " + (str(exc).strip().splitlines() or [""])[0]
    return "no error" if out is None else str(out.dtype).removeprefix("torch.")"""


def _observed_cases(
    cases: Sequence[tuple[str, Captured]], extra: Sequence[str], device: str, dtype: torch.dtype
) -> tuple[str, dict[str, torch.Tensor]]:
    """The cases' functions, ``observe`` and ``CASES = [(label, case_i, inputs<extra>), ...]``."""
    defs, calls, tensors = _cases(cases)
    rows = "\n".join(
        f"    ({label!r}, {call}{more})," for (label, _), call, more in zip(cases, calls, extra, strict=True)
    )
    nl = "\n\n\n"
    return f"{nl.join(defs)}\n\n\n{_observe(device, dtype)}\n\n\nCASES = [\n{rows}\n]", tensors


def autocast_dtypes(
    what: str, cases: Sequence[tuple[str, Captured, str]], device: str, dtype: torch.dtype, origin: str
) -> FailureRepro:
    """Each case's calls under autocast: the output dtype (or the error's first line) against the
    ``expected`` one (the golden table's, or the rule's)."""
    prelude, tensors = _observed_cases(
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


def compiled_dtypes(
    what: str, cases: Sequence[tuple[str, Captured]], device: str, dtype: torch.dtype, backend: str
) -> FailureRepro:
    """Each case's calls under autocast, eager and through ``torch.compile(backend=...)``: the
    compiled output dtype (or the error's first line) against eager's, computed beside it."""
    prelude, tensors = _observed_cases(cases, ["" for _ in cases], device, dtype)
    code = f"""{prelude}
measured = 0
for label, run, inputs in CASES:
    eager = observe(run, inputs)  # reference: the same calls, eager, under the same autocast
    torch._dynamo.reset()  # each op compiled on its own, as the check compiles it
    compiled = observe(torch.compile(run, backend={backend!r}), inputs)
    print(f"{{label}}: compiled {{compiled}}, eager {{eager}}" + ("" if compiled == eager else "   <- differs"))
    measured += compiled != eager  # ops whose compiled output dtype is not eager's
allowed = 0"""
    return FailureRepro(
        "compiled", what, code, "exact: autocast's choice of dtype is eager's, compiled or not", tensors, device=device
    )


def autocast_hand_cast(
    what: str, cases: Sequence[tuple[str, Captured]], device: str, dtype: torch.dtype
) -> FailureRepro:
    """Each case under autocast against the same calls with autocast disabled on its inputs cast
    by hand to the dtype autocast chose: bitwise equal, as PyTorch's own autocast tests require."""
    defs, calls, tensors = _cases(cases)
    rows = "\n".join(f"    ({label!r}, {call})," for (label, _), call in zip(cases, calls, strict=True))
    dev = device.split(":")[0]
    nl = "\n\n\n"
    code = f"""{nl.join(defs)}


CASES = [
{rows}
]
measured = 0
for label, run, inputs in CASES:
    torch.manual_seed(0)
    with torch.autocast({dev!r}, dtype={_dtype(dtype)}):
        got = run(*inputs)
    # reference: autocast's own rule, cast the inputs by hand and run the op without autocast
    by_hand = [t.to(got.dtype) if t.is_floating_point() else t for t in inputs]
    torch.manual_seed(0)
    with torch.autocast({dev!r}, enabled=False):
        ref = run(*by_hand)
    same = got.dtype == ref.dtype and got.shape == ref.shape and bool(((got == ref) | (got.isnan() & ref.isnan())).all())
    worst = (got.double() - ref.double()).abs().nan_to_num(0.0).max().item() if got.shape == ref.shape else None
    print(f"{{label}}: autocast {{got.dtype}}, by hand {{ref.dtype}}, " + ("bitwise equal" if same else f"differ (max |diff| {{worst}})"))
    measured += not same  # ops unlike their hand-cast run
allowed = 0"""
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
    defs, calls, tensors = _cases(flat)
    it = iter(calls)
    rows = "\n".join(
        f"    ({label!r}, {{{', '.join(f'{k!r}: ({next(it)})' for k in caps)}}}, {exp!r}, {list(ok)!r}),"
        for label, caps, exp, ok in cases
    )
    nl = "\n\n\n"
    low = _dtype(dtype).removeprefix("torch.")
    code = f"""{nl.join(defs)}


{_observe(device, dtype)}


def behaves_as(seen):
    \"\"\"The autocast list the observations show (the harness's rule, written out).\"\"\"
    if seen["fp32_in"].startswith("raises"):
        return "raises"
    if seen["fp32_in"] == {low!r}:
        return "lower_precision"
    if seen.get("lowp_in") == "float32":
        return "fp32"
    if seen.get("mixed_in") == "float32":
        return "widest_input"
    return "follows_input"


# reference: how PyTorch's own autocast test lists file each op, and the behaviour each filing accepts
CASES = [
{rows}
]
measured = 0
for label, runs, filed_as, accepted in CASES:
    seen = {{kind: observe(run, inputs) for kind, (run, inputs) in runs.items()}}
    got = behaves_as(seen)
    print(f"{{label}}: behaves as {{got}} {{seen}}; PyTorch's lists say {{filed_as}}" + ("" if got in accepted else "   <- differs"))
    measured += got not in accepted  # ops unlike their filing
allowed = 0"""
    return FailureRepro("autocast", what, code, origin, tensors, device=device)


def format_limits(what: str, fmt_name: str, names: Sequence[str]) -> FailureRepro:
    """``torch.finfo``'s limits of a format against the same limits computed from its bit layout
    (exponent and mantissa widths, bias, and which all-ones patterns are not finite)."""
    fmt = format_of(fmt_name)
    ieee = fmt.encoding.value == "ieee"
    code = f"""fi = torch.finfo(torch.{fmt.name})
E = round(math.log2(math.log2(float(fi.max)))) + 1  # exponent width, from finfo alone as the check does
got = {{
    "max": float(fi.max),
    "smallest_normal": float(fi.smallest_normal),
    "smallest_subnormal": float(fi.smallest_normal) * 2.0 ** -(fi.bits - 1 - E),
    "eps": float(fi.eps),
    "unit_roundoff": float(fi.eps) / 2,
}}
# reference: the bit layout ({fmt.exponent_bits} exponent bits, {fmt.mantissa_bits} mantissa bits, bias 2^(E-1) - 1); {
        "the all-ones exponent is inf and NaN (IEEE 754)" if ieee else "only the all-ones pattern is NaN (OCP)"
    }
EB, MB = {fmt.exponent_bits}, {fmt.mantissa_bits}
BIAS = 2 ** (EB - 1) - 1
EMAX = 2**EB - {2 if ieee else 1} - BIAS  # the largest exponent of a finite value
TOP = 2 - 2.0 ** -{"MB" if ieee else "(MB - 1)"}  # its largest significand{
        "" if ieee else " (all-ones mantissa there is NaN)"
    }
ref = {{
    "max": TOP * 2.0**EMAX,
    "smallest_normal": 2.0 ** (1 - BIAS),
    "smallest_subnormal": 2.0 ** (1 - BIAS - MB),
    "eps": 2.0**-MB,
    "unit_roundoff": 2.0 ** -(MB + 1),
}}
differ = [k for k in {list(names)!r} if got[k] != ref[k]]
for k in differ:
    print(f"{fmt.name} {{k}}: torch.finfo gives {{got[k]!r}}, the bit layout {{ref[k]!r}}")
measured = len(differ)  # limits unlike the bit layout
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: a format's limits follow from its bit layout")


def code_decoding(what: str, dtype_name: str) -> FailureRepro:
    """torch's decoding of all 256 codes of an 8-bit float format (viewed from uint8, converted to
    float32) against the value each code's bit layout defines, written out from the layout."""
    if dtype_name == "float8_e8m0fnu":
        layout = "EB, MB, BIAS, KIND = 8, 0, 127, 'e8m0'  # exponent only: 2^(code - 127), 0xFF NaN (OCP MX)"
    else:
        fmt = format_of(dtype_name)
        kind = "ieee" if fmt.encoding.value == "ieee" else "fn"
        layout = f"EB, MB, BIAS, KIND = {fmt.exponent_bits}, {fmt.mantissa_bits}, {fmt.bias}, {kind!r}  # " + (
            "IEEE 754: all-ones exponent is inf (mantissa 0) or NaN"
            if kind == "ieee"
            else "OCP: only S.1111.111 is NaN, no inf"
        )
    code = f"""got = torch.arange(256, dtype=torch.uint8).view(torch.{dtype_name}).to(torch.float32).tolist()
# reference: the value of each code from its bit layout
{layout}


def decode(c):
    if KIND == "e8m0":
        return math.nan if c == 0xFF else math.ldexp(1.0, c - BIAS)
    sign = -1.0 if c >> (EB + MB) else 1.0
    e, m = (c >> MB) & (2**EB - 1), c & (2**MB - 1)
    if KIND == "ieee" and e == 2**EB - 1:
        return sign * math.inf if m == 0 else math.nan
    if KIND == "fn" and e == 2**EB - 1 and m == 2**MB - 1:
        return math.nan
    if e == 0:  # subnormal: no implicit one, the smallest exponent
        return sign * math.ldexp(m, 1 - BIAS - MB)
    return sign * math.ldexp(2**MB + m, e - BIAS - MB)


ref = [decode(c) for c in range(256)]
differ = [(c, g_, r_) for c, (g_, r_) in enumerate(zip(got, ref)) if not (g_ == r_ or (g_ != g_ and r_ != r_))]
for c, g_, r_ in differ[:8]:
    print(f"code {{c:#04x}}: torch {{g_!r}}, bit layout {{r_!r}}")
measured = len(differ)  # codes decoded unlike their bit layout
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: a code's value follows from the format's bit layout")


def e8m0_rounding(what: str, values: torch.Tensor) -> FailureRepro:
    """torch's float32 -> e8m0 cast of positive values, none of them a tie, against the nearest
    power of two in value, found exactly (frexp and comparisons of Python floats)."""
    code = """got = x.to(torch.float8_e8m0fnu).view(torch.uint8).tolist()
# reference: the nearest power of two in value, as the code 127 + its exponent (no ties among x)


def nearest(v):
    e = math.frexp(v)[1] - 1  # 2^e <= v < 2^(e + 1), exactly
    return 127 + (e if v - math.ldexp(1.0, e) < math.ldexp(1.0, e + 1) - v else e + 1)


ref = [nearest(v) for v in x.tolist()]
differ = [(v, g_, r_) for v, g_, r_ in zip(x.tolist(), got, ref) if g_ != r_]
for v, g_, r_ in differ[:8]:
    print(f"cast of {v!r}: torch code {g_}, nearest power of two code {r_}")
measured = len(differ)  # values not cast to their nearest power of two
allowed = 0"""
    return FailureRepro(
        "formats", what, code, "exact: e8m0 holds powers of two, the nearest one in value", {"x": values}
    )


def stochastic_rounding(what: str, x: torch.Tensor, draws: int, seed: int, false_alarm: float) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding, ``draws`` draws of each input under one seed,
    against the rule it promises: each draw one of the input's two bf16 neighbours (from the fp32
    bits), the count away from zero Binomial(draws, p) with p the low 16 bits over 2^16, judged
    by exact binomial p-values (log-gamma sums), Bonferroni over the inputs."""
    code = f"""from torchao.optim.quant_utils import _fp32_to_bf16_sr

n, seed, false_alarm = {draws}, {seed}, {false_alarm!r}
torch.manual_seed(seed)
got = _fp32_to_bf16_sr(x.unsqueeze(0).expand(n, -1).contiguous()).to(torch.float64)
# reference: the bf16 neighbours toward and away from zero, and the exact chance of rounding away
bits = x.view(torch.int32).to(torch.int64)
lo = (bits & ~0xFFFF).to(torch.int32).view(torch.float32).to(torch.float64)
hi = ((bits & ~0xFFFF) + 0x10000).to(torch.int32).view(torch.float32).to(torch.float64)
p_away = ((bits & 0xFFFF).to(torch.float64) / 65536).tolist()
off = int((~((got == lo) | (got == hi))).sum())
away = (got == hi).sum(0).tolist()


def two_sided(k, p):  # exact Binomial(n, p) two-sided p-value: twice the smaller tail, at most 1
    if p in (0.0, 1.0):
        return 1.0 if k == n * p else 0.0
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                    + i * math.log(p) + (n - i) * math.log1p(-p)) for i in range(n + 1)]
    return min(1.0, 2 * min(sum(pmf[: k + 1]), sum(pmf[k:])))


adjusted = [two_sided(k, p) * len(away) for k, p in zip(away, p_away)]  # Bonferroni over the inputs
i = min(range(len(adjusted)), key=adjusted.__getitem__)
print(f"draws off the two neighbours: {{off}} of {{got.numel()}}")
print(f"input {{x[i].item()!r}}: {{away[i]}} of {{n}} draws away from zero, {{n * p_away[i]:.4g}} expected; "
      f"adjusted p-value {{adjusted[i]:.3g}}")
# -log10 of the adjusted p-value (inf: draws off the neighbours); a correct rounding exceeds the
# allowed -log10(false_alarm) once in 1 / false_alarm runs
measured = math.inf if off else -math.log10(max(adjusted[i], 1e-300))
allowed = -math.log10(false_alarm)"""
    return FailureRepro(
        "fp8",
        what,
        code,
        f"every draw a neighbour (exact); each input's count away from zero Binomial({draws}, p): a correct "
        f"rounding falls below the adjusted p-value {false_alarm:g} once in {1 / false_alarm:.0e} runs",
        {"x": x},
        needs=("torch", "torchao"),
    )


def stochastic_draws(what: str, x: torch.Tensor, draws: int, seed: int) -> FailureRepro:
    """torchao's fp32 -> bf16 stochastic rounding of ``x`` (one input halfway between its bf16
    neighbours), ``draws`` times under ``seed``, ``seed + 1`` and ``seed`` again: both neighbours
    drawn, the seeds' draws different, the repeated seed's the same."""
    code = f"""from torchao.optim.quant_utils import _fp32_to_bf16_sr

n, seed = {draws}, {seed}


def draw(s):  # n draws of x under torch.manual_seed(s), as the check drew them
    torch.manual_seed(s)
    return _fp32_to_bf16_sr(x.unsqueeze(0).expand(n, -1).contiguous()).to(torch.float64)


a, b, again = draw(seed), draw(seed + 1), draw(seed)
# reference: a stochastic rounding is random (both neighbours of a halfway input, all one with
# chance (1/2)^(n-1); two seeds alike with chance (1/2)^n) and replayable (one seed, one sequence)
wrong = []
if torch.unique(a).numel() != 2:
    wrong.append(f"{{n}} draws of a halfway input gave {{torch.unique(a).numel()}} distinct values, not both neighbours")
if torch.equal(a, b):
    wrong.append(f"seeds {{seed}} and {{seed + 1}} drew the same {{n}} values")
if not torch.equal(a, again):
    wrong.append(f"seed {{seed}} drew {{int((a != again).sum())}} of {{n}} values differently the second time")
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0"""
    return FailureRepro(
        "fp8",
        what,
        code,
        f"exact, up to chance: a correct rounding fails the first two with chance (1/2)^{draws - 1} and "
        f"(1/2)^{draws}, the third never",
        {"x": x},
        needs=("torch", "torchao"),
    )


#: An MX block's e8m0 scale code from its amax, as script source (both MX scripts define it): the
#: OCP modes FLOOR and CEIL from the bits, RCEIL from the exact ratio to the element's max.
_E8M0_CODE = """def e8m0_code(a, mode, elem_max):  # a block's e8m0 code (bias 127), clamped as torchao clamps
    if a == 0:
        return 0
    if mode == "rceil":  # the smallest power of two at or above amax / elem_max, exactly
        q = Fraction(a) / Fraction(elem_max)
        e = q.numerator.bit_length() - q.denominator.bit_length()
        while Fraction(2) ** e < q:
            e += 1
        while Fraction(2) ** (e - 1) >= q:
            e -= 1
        return min(max(e + 127, 0), 254)
    floor = math.frexp(a)[1] - 1  # floor(log2 amax), from the bits
    e = floor if mode == "floor" or a == math.ldexp(1.0, floor) else floor + 1
    return min(max(e - (math.frexp(elem_max)[1] - 1) + 127, 0), 255)"""


def mx_scale_codes(
    what: str, x: torch.Tensor, elem: str, elem_max: float, mode: str, block: int, excused: Sequence[int]
) -> FailureRepro:
    """torchao's MX block scales (``to_mx``) of ``x`` against the e8m0 code each block's amax
    defines (OCP MX: FLOOR, CEIL; RCEIL from the exact ratio to the element's max), with torchao's
    clamps; ``excused``: blocks a registered finding covers (RCEIL one code low near a power of two)."""
    code = f"""from fractions import Fraction

from torchao.prototype.mx_formats import config, mx_tensor

BLOCK, MODE = {block}, {mode!r}
ELEM_MAX = {elem_max!r}  # the element format's largest finite value
EXCUSED = {list(excused)!r}  # blocks of torchao's registered finding torchao-rceil-scale-near-power-of-2
codes, _ = mx_tensor.to_mx(x, {elem}, BLOCK, scaling_mode=config.ScaleCalculationMode(MODE))
got = codes.view(torch.uint8).flatten().tolist()


{_E8M0_CODE}


values = x.tolist()
wrong = 0
for i, g in enumerate(got):
    a = max(abs(v) for v in values[i * BLOCK : (i + 1) * BLOCK])
    want = e8m0_code(a, MODE, ELEM_MAX)
    if g != want and i not in EXCUSED:
        print(f"block {{i}}, amax {{a!r}}: torchao code {{g}}, by definition {{want}}")
        wrong += 1
measured = wrong  # blocks whose scale code differs
allowed = 0"""
    return FailureRepro(
        "fp8", what, code, "exact: the scale code is a function of the block's amax", {"x": x}, ("torch", "torchao")
    )


def block_bits(
    what: str,
    x: torch.Tensor,
    spec: Mapping[str, Any],
    excused_blocks: Sequence[tuple[int, int]],
    excused_elements: Sequence[tuple[int, int]],
) -> FailureRepro:
    """torchao's block-scaled bits of ``x`` (MX: ``MXTensor.to_mx``; NVFP4: ``NVFP4Tensor.to_nvfp4``
    with its per-tensor scale) against the specification in exact rationals: the per-tensor scale,
    each block's scale code and each element's code. ``spec``: ``block`` (rows, cols), ``scale``
    ("e8m0" or "e4m3"), ``mode`` (MX), ``per_tensor``, ``elem`` (``ebits``, ``mbits``, ``max``,
    ``torch``: its torch dtype's name); the excused cells are those a registered torchao finding
    covers."""
    br, bc = spec["block"]
    elem = spec["elem"]
    fp4 = elem["ebits"] + elem["mbits"] == 3
    unpack = (
        "\n\n\ndef unpack(p):  # two e2m1 codes per byte, low nibble first (torchao's packing)\n"
        "    p = p.view(torch.uint8)\n"
        "    return torch.stack((p & 0xF, p >> 4), dim=-1).reshape(*p.shape[:-1], p.shape[-1] * 2)\n"
        if fp4
        else ""
    )
    as_codes = "unpack(t.qdata)" if fp4 else "t.qdata.view(torch.uint8)"
    if spec["scale"] == "e8m0":
        quantize = f"""from torchao.prototype.mx_formats import config, mx_tensor
{unpack}
t = mx_tensor.MXTensor.to_mx(x, torch.{elem["torch"]}, {bc}, config.ScaleCalculationMode({spec["mode"]!r}))
got_tensor_scale = None"""
    else:
        pts = "nv.per_tensor_amax_to_scale(x.abs().max())" if spec["per_tensor"] else "None"
        quantize = f"""from torchao.prototype.mx_formats import nvfp4_tensor as nv
{unpack}
pts = {pts}
t = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
got_tensor_scale = None if pts is None else float(pts)"""
    code = f"""from fractions import Fraction

{quantize}
rows, cols = x.shape
got_scales = t.scale.view(torch.uint8).reshape(rows, cols // {bc}).tolist()
got_codes = {as_codes}.reshape(rows, cols).tolist()

# the specification, in exact rationals
F = Fraction
EBITS, MBITS, EMAX_VALUE = {elem["ebits"]}, {elem["mbits"]}, F({elem["max"]!r})  # the element format
BLOCK = ({br}, {bc})
# covered by torchao's registered findings: block scales (judged with torchao's), and elements
EXCUSED_BLOCKS = {sorted(excused_blocks)!r}
EXCUSED_ELEMENTS = {sorted(excused_elements)!r}


def floor_log2(q):  # floor(log2 q) for a positive rational, exactly
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while F(2) ** e > q:
        e -= 1
    while F(2) ** (e + 1) <= q:
        e += 1
    return e


def rne(q, mbits, emin):  # q >= 0 to nearest with mbits fraction bits, subnormal below 2^emin, ties to even
    if q == 0:
        return F(0)
    quantum = F(2) ** (max(floor_log2(q), emin) - mbits)
    return round(q / quantum) * quantum  # Fraction's round: half to even


def encode(v, ebits, mbits):  # a representable v >= 0 as its code (sign bit clear)
    emin = 2 - 2 ** (ebits - 1)
    if v < F(2) ** emin:
        return int(v / F(2) ** (emin - mbits))
    e = floor_log2(v)
    return (e - emin + 1) << mbits | int(v / F(2) ** (e - mbits)) - (1 << mbits)


def element(x, decode):  # x / decode to nearest even, saturating; the sign is x's
    emin = 2 - 2 ** (EBITS - 1)
    v = min(rne(F(abs(x)) / decode, MBITS, emin), EMAX_VALUE)
    return (1 << (EBITS + MBITS) if math.copysign(1.0, x) < 0 else 0) | encode(v, EBITS, MBITS)


def f32(q):  # a rational to float32, to nearest even (normal range)
    return float(rne(q, 23, -126))


def e4m3(q):  # an e4m3 block scale: clamped to [2^-6, 448], to nearest even
    return encode(rne(min(max(q, F(2) ** -6), F(448)), 3, -6), 4, 3)


def e4m3_value(c):
    e, m = c >> 3, c & 7
    return F(m, 8) * F(2) ** -6 if e == 0 else (1 + F(m, 8)) * F(2) ** (e - 7)
{_BLOCK_SCALE[spec["scale"]].format(mode=spec["mode"], e8m0_code=_E8M0_CODE)}

values = x.tolist()
wrong = 0
tensor_scale = {"f32(F(max(abs(v) for r in values for v in r)) / 2688)" if spec["per_tensor"] else "None"}
SHOWN = 12  # mismatches printed (all are counted)
if tensor_scale != got_tensor_scale:
    print(f"per-tensor scale {{got_tensor_scale!r}}, by definition amax / 2688 = {{tensor_scale!r}}")
    wrong += 1
for i in range(rows // BLOCK[0]):
    for j in range(cols // BLOCK[1]):
        cells = [(r, c) for r in range(i * BLOCK[0], (i + 1) * BLOCK[0]) for c in range(j * BLOCK[1], (j + 1) * BLOCK[1])]
        if tensor_scale == 0:  # a tensor of zeros (or below float32 once divided): nothing to scale
            continue
        g, (want, accepted) = got_scales[i][j], scale_codes(max(abs(values[r][c]) for r, c in cells), tensor_scale)
        if g not in accepted and (i, j) not in EXCUSED_BLOCKS:
            wrong += 1
            if wrong <= SHOWN:
                print(f"block ({{i}}, {{j}}): scale code {{g:#04x}}, by definition {{want:#04x}}")
        use = g if g in accepted or (i, j) in EXCUSED_BLOCKS else want
        for r, c in cells:  # each element with the scale the quantiser chose, where that one was right
            if (r, c) in EXCUSED_ELEMENTS:
                continue
            w, ok = element_codes(values[r][c], decode(use, tensor_scale))
            if got_codes[r][c] not in ok:
                wrong += 1
                if wrong <= SHOWN:
                    print(f"element ({{r}}, {{c}}) = {{values[r][c]!r}}: code {{got_codes[r][c]:#x}}, by definition {{w:#x}}")
if wrong > SHOWN:
    print(f"... and {{wrong - SHOWN}} more")
measured = wrong  # the per-tensor scale, block scales and element codes unlike the definition
allowed = 0"""
    return FailureRepro(
        "fp8",
        what,
        code,
        "exact: the bits are a function of the tensor"
        + (
            " (either neighbour where the exact ratio lies within float32 evaluation's rounding of a tie: two "
            "roundings for a block scale, three for an element)"
            if spec["scale"] == "e4m3"
            else ""
        ),
        {"x": x},
        ("torch", "torchao"),
    )


#: each block-scale family's reference: ``scale_codes(block_amax, tensor_scale)`` -> (the code, the
#: codes accepted), ``decode(code, tensor_scale)``, ``element_codes(x, decode)`` -> (code, accepted)
_BLOCK_SCALE = {
    "e8m0": """


{e8m0_code}


def scale_codes(a, _):  # the block's e8m0 code: one, exactly
    code = e8m0_code(a, {mode!r}, float(EMAX_VALUE))
    return code, (code,)


def decode(code, _):
    return F(2) ** (code - 127)


def element_codes(x, d):  # dividing by a power of two is exact: one code
    c = element(x, d)
    return c, (c,)""",
    "e4m3": """
W_SCALE, W_ELEMENT = (1 + F(1, 2**24)) ** 2 - 1, (1 + F(1, 2**24)) ** 3 - 1  # float32 evaluation's windows


def scale_codes(a, ts):  # NVFP4: e4m3(block_amax / 6 / s_t), and its neighbours within W_SCALE
    q = F(a) / 6 / (F(ts) if ts is not None else 1)
    return e4m3(q), (e4m3(q), e4m3(q * (1 - W_SCALE)), e4m3(q * (1 + W_SCALE)))


def decode(code, ts):
    return e4m3_value(code) * (F(ts) if ts is not None else 1)


def element_codes(x, d):
    return element(x, d), (element(x, d), element(x, d / (1 - W_ELEMENT)), element(x, d / (1 + W_ELEMENT)))""",
}


def torch_values(what: str, cases: Sequence[tuple[str, str, float]], origin: str) -> FailureRepro:
    """torch expressions (source text) against the exact values a check expected of them."""
    rows = "\n".join(f"    ({name!r}, lambda: {src}, {_float_src(expected)})," for name, src, expected in cases)
    code = f"""# reference: the values the check expected, exactly
CASES = [
{rows}
]
measured = 0
for name, value, expected in CASES:
    got = float(value())
    print(f"{{name}}: {{got!r}}; expected {{expected!r}}" + ("" if got == expected else "   <- differs"))
    measured += got != expected  # values unlike the expected ones
allowed = 0"""
    return FailureRepro("formats", what, code, origin)


def cast_outcomes(what: str, cases: Sequence[tuple[str, float, str]], device: str = "cpu") -> FailureRepro:
    """torch's cast of float32 values to fp8 formats, each result described as the check describes
    it (``max``, ``-max``, ``inf``, ``nan`` or the value), against the expected description."""
    rows = "\n".join(f"    ({name!r}, {_float_src(x)}, {exp!r})," for name, x, exp in cases)
    code = f"""def describe(v, fmax):
    if v != v:
        return "nan"
    if v in (math.inf, -math.inf):
        return "inf" if v > 0 else "-inf"
    if abs(v) == fmax:
        return "max" if v > 0 else "-max"
    return repr(v)


# reference: what the check expected of each cast (the golden table of this release, or the rule)
CASES = [
{rows}
]
measured = 0
for name, x, expected in CASES:
    dtype = getattr(torch, name)
    got = torch.tensor([x], dtype=torch.float32, device={device!r}).to(dtype).float().item()
    seen = describe(got, float(torch.finfo(dtype).max))
    print(f"{{name}} cast of {{x!r}}: {{seen}}; expected {{expected}}" + ("" if seen == expected else "   <- differs"))
    measured += seen != expected  # casts unlike the expected ones
allowed = 0"""
    return FailureRepro("formats", what, code, "exact", device=device)


def e8m0_outcomes(what: str, cases: Sequence[tuple[str, float, int]], device: str = "cpu") -> FailureRepro:
    """torch's float32 -> e8m0 cast of the values whose code left this stack's golden table (ties,
    zero, sign, overflow: what the format leaves open), each against the code the table holds."""
    rows = "\n".join(f"    ({name!r}, {_float_src(x)}, {code})," for name, x, code in cases)
    code = f"""# reference: the code each value cast to when this release's golden table was stored
CASES = [
{rows}
]
measured = 0
for name, x, expected in CASES:
    got = torch.tensor([x], dtype=torch.float32, device={device!r}).to(torch.float8_e8m0fnu).view(torch.uint8).item()
    print(f"e8m0 cast of {{name}} ({{x!r}}): code {{got}}; golden {{expected}}" + ("" if got == expected else "   <- differs"))
    measured += got != expected  # casts unlike the golden table's
allowed = 0"""
    return FailureRepro("formats", what, code, "exact: the golden table of this torch release", device=device)


def fp4_casts(what: str, values: torch.Tensor) -> FailureRepro:
    """torchao's e2m1 (fp4) kernels, the casts MX training uses: decode of all 16 codes against the
    bit layout, and float32 -> e2m1 of ``values`` against round-to-nearest-even in exact rationals,
    saturating beyond the largest value (the format has no inf or NaN)."""
    code = """from fractions import Fraction

from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, f32_to_f4_unpacked


# reference: e2m1's bit layout (sign, 2 exponent bits with bias 1, 1 mantissa bit; exponent 0 subnormal)
def decode(c):
    e, m = (c >> 1) & 3, c & 1
    magnitude = m / 2 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)
    return -magnitude if c & 8 else magnitude


def nearest_even(v):  # the nearest code in exact rationals, ties to the even code; beyond 6: 6
    sign = 8 if v < 0 or (v == 0 and math.copysign(1.0, v) < 0) else 0
    best = min(range(8), key=lambda c: (abs(Fraction(abs(v)) - Fraction(decode(c))), c & 1))
    return sign | best


codes = torch.arange(16, dtype=torch.uint8)
decoded = f4_unpacked_to_f32(codes).tolist()
bad_decode = [(c, g) for c, g in zip(range(16), decoded) if g != decode(c)]
got = f32_to_f4_unpacked(x).tolist()
bad_round = [(v, g, nearest_even(v)) for v, g in zip(x.tolist(), got) if g != nearest_even(v)]
for c, g in bad_decode[:8]:
    print(f"code {c:#x} decodes to {g!r}; its bit layout says {decode(c)!r}")
for v, g, r in bad_round[:8]:
    print(f"{v!r} cast to code {g:#x} ({decode(g)!r}); nearest-even is {r:#x} ({decode(r)!r})")
measured = len(bad_decode) + len(bad_round)  # codes decoded and values cast unlike the format says
allowed = 0"""
    return FailureRepro(
        "formats",
        what,
        code,
        "exact: e2m1's bit layout, and round-to-nearest-even saturating at 6",
        {"x": values},
        needs=("torch", "torchao"),
    )


def _float_src(x: float) -> str:
    return repr(x) if math.isfinite(x) else f"float({str(x)!r})"


def _dict_src(d: Mapping[str, Any]) -> str:
    """A dict of plain values as source (inf and NaN included)."""
    items = (f"{k!r}: {_float_src(v) if isinstance(v, float) else repr(v)}" for k, v in d.items())
    return "{" + ", ".join(items) + "}"


_F32 = """def f32(x):  # a Python float rounded to float32, to nearest; beyond its range: inf
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)"""  # the scalers' scripts round as float32 holds a scale


def scaler_rules(
    what: str, scaler_cls: str, transcript: Sequence[tuple[str, Mapping[str, Any]]], cap_growth: bool
) -> FailureRepro | None:
    """The GradScaler state machine's failing example, its rules replayed in order on the scaler
    suite's model, against the scaler rule written out (torch semantics, float32-faithful): after
    every rule the scale and growth tracker, and after every step with inf/NaN the parameters and
    optimizer state left bit-identical. None when ``scaler_cls`` cannot be imported standalone or
    the transcript does not start with the machine's setup."""
    module, _, qualname = scaler_cls.rpartition(".")
    if not module.startswith("torch") or "<" in qualname or not transcript or transcript[0][0] != "setup":
        return None
    rules = ",\n".join(f"    ({name!r}, {_dict_src(args)})" for name, args in transcript)
    group = (
        'import torch.distributed as dist\n\ndist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)\n'
        if "Sharded" in qualname
        else ""
    )
    code = f"""import struct

import {module}
{group}
# the failing example hypothesis found: the machine's rules in the order they ran
RULES = [
{rules},
]
CAP_GROWTH = {cap_growth!r}  # a growth overflowing float32 is not applied (torch semantics)


{_F32}


def rule_update(scale, tracker, found_inf, cfg):  # reference: torch's loss-scaling rule, written out
    if found_inf:
        return f32(scale * cfg["backoff"]), 0
    if tracker + 1 == cfg["growth_interval"]:
        grown = f32(scale * cfg["growth"])
        return (grown if math.isfinite(grown) or not CAP_GROWTH else scale), 0
    return scale, tracker + 1


def optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)


def state(opt):
    return [v.clone() if torch.is_tensor(v) else torch.tensor(float(v)) for s in opt.state_dict()["state"].values() for _, v in sorted(s.items())]


def same(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and bool(((x == y) | (x.isnan() & y.isnan())).all()) for x, y in zip(a, b))


measured = 0
for n, (name, a) in enumerate(RULES):
    if name == "setup":
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4), torch.nn.Linear(4, 1))
        params = list(model.parameters())
        opts = [optimizer(a["opt_kind"], p) for p in ([params[:2], params[2:]] if a["two_optimizers"] else [params])]
        x = torch.randn(16, 6, generator=torch.Generator().manual_seed(1))
        y = torch.randn(16, 1, generator=torch.Generator().manual_seed(2))
        cfg = dict(growth=a["growth"], backoff=a["backoff"], growth_interval=a["growth_interval"])
        init = 2.0 ** a["init_exp"]
        scaler = {scaler_cls}("cpu", init_scale=init, growth_factor=a["growth"], backoff_factor=a["backoff"], growth_interval=a["growth_interval"])
        scale, tracker = f32(init), 0
    elif name == "set_scale":
        value = 2.0 ** a["exponent"]
        scaler.update(torch.tensor(value) if a["as_tensor"] else value)
        scale = f32(value)  # update(new_scale): the scale replaced, the tracker kept
    elif name == "reload_into_a_fresh_scaler":
        fresh = {scaler_cls}("cpu")
        fresh.load_state_dict(scaler.state_dict())
        scaler = fresh
    elif name == "change_growth_interval":
        scaler.set_growth_interval(a["interval"])
        cfg["growth_interval"] = a["interval"]
    else:  # a step: backward (micro-batches), maybe a gradient made inf/NaN, maybe clipping or a misuse
        for o in opts:
            o.zero_grad(set_to_none=False)
        k = a.get("micro_batches", 1)
        for i in range(k):
            scaler.scale(torch.nn.functional.mse_loss(model(x[i::k]), y[i::k]) / k).backward()
        if name == "overflow_step":
            params[a["index"]].grad.view(-1)[0] = a["value"]
        if name == "accumulated_step" and a["overflow"]:
            params[0].grad.view(-1)[0] = math.inf
        found = [any(not bool(p.grad.isfinite().all()) for p in o.param_groups[0]["params"]) for o in opts]
        before = [([p.detach().clone() for p in o.param_groups[0]["params"]], state(o)) for o in opts]
        if name == "clipped_step":
            for o in opts:
                scaler.unscale_(o)
            torch.nn.utils.clip_grad_norm_(params, a["max_norm"])
        if name == "documented_misuse_raises":
            m = a["misuse"]
            if m == "unscale_twice":
                scaler.unscale_(opts[0])
            if m in ("unscale_after_step", "step_twice"):
                scaler.step(opts[0])
            try:
                scaler.unscale_(opts[0]) if m in ("unscale_twice", "unscale_after_step") else scaler.step(opts[0], **({{"closure": lambda: None}} if m == "closure" else {{}}))
            except RuntimeError:
                pass
            for o in opts:
                if m == "closure" or o is not opts[0] or m == "unscale_twice":
                    scaler.step(o)
        else:
            for o in opts:
                scaler.step(o)
        scaler.update()
        scale, tracker = rule_update(scale, tracker, any(found), cfg)
        for o, inf, (p0, s0) in zip(opts, found, before):
            if inf and name != "documented_misuse_raises" and not (same([p.detach() for p in o.param_groups[0]["params"]], p0) and same(state(o), s0)):
                print(f"rule {{n}} {{name}} {{a}}: a step with inf/NaN gradients changed parameters or optimizer state")
                measured += 1
    got, want = (scaler.get_scale(), scaler._get_growth_tracker()), (scale, tracker)
    if got != want:
        print(f"rule {{n}} {{name}} {{a}}: scaler (scale, growth tracker) = {{got}}, the rule gives {{want}}")
        measured += 1
allowed = 0  # rules after which the scaler is unlike the rule"""
    return FailureRepro("scaler", what, code, "exact: the rule is float32-faithful, the trace deterministic")


#: The third-party scalers' rules, written out as the conformance machine's specification holds
#: them (``harness.domains.scaling.reference.update``): one iteration's update of the state.
_SPEC_RULES = {
    "megatron": """def spec_update(s, found_inf):  # reference: megatron-core's DynamicGradScaler rule, written out
    if found_inf:  # the scale backs off once hysteresis overflows have been seen, never below min_scale
        left = s["hysteresis_left"] - 1
        scale = max(f32(s["scale"] * CFG["backoff_factor"]), CFG["min_scale"]) if left <= 0 else s["scale"]
        return dict(s, scale=scale, tracker=0, hysteresis_left=left)
    if s["tracker"] + 1 == CFG["growth_interval"]:  # growth_interval clean iterations: grow, hysteresis refilled
        return dict(s, scale=f32(s["scale"] * CFG["growth_factor"]), tracker=0, hysteresis_left=CFG["hysteresis"])
    return dict(s, tracker=s["tracker"] + 1)""",
    "deepspeed": """def spec_update(s, found_inf):  # reference: DeepSpeed's DynamicLossScaler rule, written out
    it = s["iteration"]  # Python floats: no float32 rounding or overflow
    if found_inf:
        if CFG["hysteresis"] == 1 or s["hysteresis_left"] == 1:
            if s["scale"] == CFG["min_scale"] and CFG["raise_at_min_scale"]:
                raise AtMinimum("an overflow at the minimum scale")
            s = dict(s, scale=max(s["scale"] / CFG["growth_factor"], CFG["min_scale"]))
        else:
            s = dict(s, hysteresis_left=s["hysteresis_left"] - 1)
        return dict(s, last_overflow_iter=it, iteration=it + 1)
    since = it - s["last_overflow_iter"]
    stable = since if SEMANTICS == "deepspeed<=0.17.0" else since - 1  # deepspeedai/DeepSpeed#6976
    if stable > 0 and stable % CFG["growth_interval"] == 0:
        s = dict(s, scale=s["scale"] * CFG["growth_factor"], hysteresis_left=CFG["hysteresis"])
    return dict(s, iteration=it + 1)""",
}

#: The scaler as the harness's ready adapter builds and drives it (harness.domains.scaling.adapters),
#: with the same CPU shims.
_SCALER_UNDER_TEST = {
    "megatron-core": """import megatron.core.optimizer.grad_scaler as grad_scaler
from torch.overrides import TorchFunctionMode


class CudaOnCpu(TorchFunctionMode):  # DynamicGradScaler makes its tensors on 'cuda': on a CPU host, there
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def make_scaler():
    args = {k: CFG[c] for k, c in (("initial_scale", "init_scale"), ("min_scale", "min_scale"),
            ("growth_factor", "growth_factor"), ("backoff_factor", "backoff_factor"),
            ("growth_interval", "growth_interval"), ("hysteresis", "hysteresis"))}
    if torch.cuda.is_available():
        return grad_scaler.DynamicGradScaler(**args)
    with CudaOnCpu():
        return grad_scaler.DynamicGradScaler(**args)


def update(scaler, found_inf):
    scaler.update(found_inf)


def state_of(scaler):  # (scale, growth tracker)
    return float(scaler.scale.item()), int(scaler._growth_tracker)""",
    "deepspeed": """import inspect
from types import SimpleNamespace

import deepspeed.runtime.fp16.loss_scaler as loss_scaler


def make_scaler():
    cls = loss_scaler.DynamicLossScaler
    args = dict(init_scale=CFG["init_scale"], scale_window=CFG["growth_interval"], min_scale=CFG["min_scale"],
                delayed_shift=CFG["hysteresis"], consecutive_hysteresis=False,
                raise_error_at_min_scale=CFG["raise_at_min_scale"])
    if "scale_factor" in inspect.signature(cls.__init__).parameters:  # up to 0.17.0
        args["scale_factor"] = CFG["growth_factor"]
    return cls(**args)


def update(scaler, found_inf):
    comm = loss_scaler.dist  # update_scale logs on rank 0; without a distributed backend, this is rank 0
    if not comm.is_initialized():
        loss_scaler.dist = SimpleNamespace(get_rank=lambda: 0)
    try:
        scaler.update_scale(found_inf)
    except Exception as exc:
        if "Current loss scale already at minimum" in str(exc):  # its way of signalling the minimum
            raise AtMinimum(str(exc)) from exc
        raise
    finally:
        loss_scaler.dist = comm


def state_of(scaler):  # (scale, growth tracker: DeepSpeed counts iterations, not clean steps)
    return float(scaler.cur_scale), None""",
}


def scaler_conformance(
    what: str, package: str, semantics: str, transcript: Sequence[tuple[str, Any]]
) -> FailureRepro | None:
    """The conformance machine's failing example against a third-party scaler (``package``: one of
    the ready adapters' packages), its iterations replayed on the scaler as the adapter drives it
    and on the ``semantics`` rule written out: after each, the scale, the growth tracker (where
    the scaler has one) and the at-minimum error compared. None for another scaler (your own
    adapter: the script would need your code) or a transcript without the machine's setup."""
    spec = _SPEC_RULES.get(semantics.split("<")[0].split(">")[0])
    under_test = _SCALER_UNDER_TEST.get(package)
    if spec is None or under_test is None or not transcript or transcript[0][0] != "setup":
        return None
    cfg = {k: v for k, v in transcript[0][1].items() if k not in ("max_scale", "cap_growth")}
    events = [bool(v) for name, v in transcript[1:] if name == "update"]
    code = f"""import struct

{under_test}


class AtMinimum(Exception):  # an overflow with the scale already at its minimum (DeepSpeed's error)
    pass


# the failing example hypothesis found: the configuration, then each iteration (True: inf/NaN gradients)
CFG = {_dict_src(cfg)}
EVENTS = {events!r}
SEMANTICS = {semantics!r}  # the rule of the installed release


{_F32}


{spec}


def outcome(fn):  # (result, "at-minimum" or None)
    try:
        return fn(), None
    except AtMinimum:
        return None, "at-minimum"


scaler = make_scaler()
s = dict(scale=f32(CFG["init_scale"]), tracker=0, hysteresis_left=CFG["hysteresis"], iteration=0, last_overflow_iter=-1)
measured = 0
for n, found_inf in enumerate([None, *EVENTS]):  # None: as constructed
    got_error = want_error = None
    if found_inf is not None:
        _, got_error = outcome(lambda: update(scaler, found_inf))
        new, want_error = outcome(lambda: spec_update(s, found_inf))
        s = new or s
    scale, tracker = state_of(scaler)
    said = "as constructed" if found_inf is None else f"iteration {{n}} ({{'overflow' if found_inf else 'clean'}})"
    if got_error != want_error:
        print(f"{{said}}: the scaler raised {{got_error}}, the rule {{want_error}}")
        measured += 1
    if scale != s["scale"] or (tracker is not None and tracker != s["tracker"]):
        print(f"{{said}}: scaler (scale, growth tracker) = {{(scale, tracker)}}, the rule gives {{(s['scale'], s['tracker'])}}")
        measured += 1
allowed = 0  # iterations after which the scaler is unlike its release's rule"""
    return FailureRepro(
        "scaler",
        what,
        code,
        f"exact: the {semantics} rule, as its source states it (the scale is a power of two times the configured "
        "factors: no rounding to allow for)",
        needs=("torch", package),
    )


def product_against_float64(
    what: str,
    product: str,
    tensors: Mapping[str, torch.Tensor],
    bound: torch.Tensor,
    floor_db: float,
    origin: str,
    *,
    needs: tuple[str, ...] = ("torch",),
    device: str = "cpu",
) -> FailureRepro:
    """A low-precision matrix product (``product``: source setting ``got``, and ``ref``, the same
    product of the high-precision operands in float64) held to an element-wise ``bound`` (saved)
    and an SQNR floor, both derived by the check from the operands' formats and scales."""
    code = f"""{product}
ref = ref.double().to(got.device)
worst = float(((got.double() - ref).abs() / bound.double()).max())  # the worst element, in units of its bound
signal, noise = float(ref.pow(2).sum()), float((got.double() - ref).pow(2).sum())
sqnr_db = 10 * math.log10(signal / noise) if noise > 0 else math.inf
FLOOR_DB = {floor_db!r}  # the SQNR the formats allow at least (standard model of rounding error)
print(f"worst element {{worst:.3g}} x its bound; SQNR {{sqnr_db:.2f}} dB, floor {{FLOOR_DB:.2f}} dB")
measured = max(worst, FLOOR_DB / sqnr_db if sqnr_db > 0 else math.inf)  # each at most 1 when within budget
allowed = 1.0"""
    return FailureRepro("fp8", what, code, origin, {**tensors, "bound": bound.detach()}, needs, device)


# -- one optimizer step under GradScaler (the scaler suite's optimizer matrix) -------------------
_OPTIMIZER_REFERENCES = {
    "SGD": """def reference(p, g, st):  # torch's SGD (momentum, weight decay), in float64
    d, d_abs = g + H["weight_decay"] * p, g.abs() + H["weight_decay"] * p.abs()
    buf = st.get("momentum_buffer")
    b, b_abs = (d, d_abs) if buf is None else (H["momentum"] * buf + d, H["momentum"] * buf.abs() + d_abs)
    new, mag = p - H["lr"] * b, p.abs() + H["lr"] * b_abs
    return new, gamma(K) * mag, {{"momentum_buffer": (b, gamma(K_STATE["momentum_buffer"]) * b_abs)}}""",
    "Adam": """def reference(p, g, st):  # torch's {name} (weight decay {decay}), in float64
    (b1, b2), lr, wd, eps = H["betas"], H["lr"], H["weight_decay"], H["eps"]
    step = float(st["step"]) + 1 if "step" in st else 1.0
    decayed, gd, gd_abs = {decayed}
    m0, v0 = st.get("exp_avg", torch.zeros_like(p)), st.get("exp_avg_sq", torch.zeros_like(p))
    m, m_abs = b1 * m0 + (1 - b1) * gd, 2 * m0.abs() + gd_abs  # torch's lerp: m0 + w (g - m0)
    v, v_abs = b2 * v0 + (1 - b2) * gd * gd, b2 * v0 + (1 - b2) * gd_abs * gd_abs
    denom = v.sqrt() / math.sqrt(1 - b2**step) + eps
    size = lr / (1 - b1**step)
    new, mag = decayed - size * m / denom, p.abs() + size * m_abs / denom
    exact = (torch.tensor(step, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))  # counts: exact
    return new, gamma(K) * mag, {{
        "exp_avg": (m, gamma(K_STATE["exp_avg"]) * m_abs),
        "exp_avg_sq": (v, gamma(K_STATE["exp_avg_sq"]) * v_abs),
        "step": exact,
    }}""",
    "Adagrad": """def reference(p, g, st):  # torch's Adagrad (weight decay, lr decay), in float64
    step = float(st["step"]) + 1
    gd, gd_abs = g + H["weight_decay"] * p, g.abs() + H["weight_decay"] * p.abs()
    s, s_abs = st["sum"] + gd * gd, st["sum"] + gd_abs * gd_abs
    clr = H["lr"] / (1 + (step - 1) * H["lr_decay"])
    std = s.sqrt() + H["eps"]
    new, mag = p - clr * gd / std, p.abs() + clr * gd_abs / std
    exact = (torch.tensor(step, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))  # counts: exact
    return new, gamma(K) * mag, {{"sum": (s, gamma(K_STATE["sum"]) * s_abs), "step": exact}}""",
}


def _loaded_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    scale: float,
    optimizer: str,
    received: str,
    device: str,
) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors and source that rebuild one step of a run: the parameters, the optimizer
    (``optimizer``: source over ``params``) loaded with its state, the scaled gradients as
    ``received`` received them, a GradScaler at ``scale``; and ``untouched()``, what a skipped step
    must leave bitwise as it was."""
    tensors: dict[str, torch.Tensor] = {}
    state_src = []
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        tensors[f"p{i}"], tensors[f"g{i}"] = p.detach(), g.detach()
        for key, value in state.get(i, {}).items():
            tensors[f"s{i}_{key}"] = value.detach()
        state_src.append("{" + ", ".join(f"{key!r}: s{i}_{key}" for key in state.get(i, {})) + "}")
    n = len(params)
    return (
        tensors,
        f"""P0 = [{", ".join(f"p{i}" for i in range(n))}]  # the parameters before the step
G = [{", ".join(f"g{i}" for i in range(n))}]  # their gradients, scaled, as {received} received them
STATE = [{", ".join(state_src)}]  # the optimizer's state before the step ({{}}: none yet)
SCALE = {scale!r}  # GradScaler's scale then (a power of two: unscaling is exact)
params = [torch.nn.Parameter(p.clone()) for p in P0]
opt = {optimizer}
for p, st in zip(params, STATE):
    if st:
        opt.state[p] = {{k: v.clone() for k, v in st.items()}}
for p, g in zip(params, G):
    p.grad = g.clone()
scaler = torch.amp.GradScaler({device!r}, init_scale=SCALE)
scaler.scale(torch.zeros((), device={device!r}))  # GradScaler creates its scale on first use


def same(a, b):  # bitwise, NaN equal to NaN
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


def untouched():  # what a skipped step must leave as it was: parameters and optimizer state
    out = [f"parameter {{i}}" for i, (p, p0) in enumerate(zip(params, P0)) if not same(p.detach(), p0)]
    for i, (p, st) in enumerate(zip(params, STATE)):
        for k, v in opt.state.get(p, {{}}).items():
            if torch.is_tensor(v) and (not same(v, st[k]) if k in st else bool((v != 0).any())):
                out.append(f"state {{k}} of parameter {{i}}")
    return out
""",
    )


def optimizer_step(
    what: str,
    name: str,
    flags: Mapping[str, bool],
    hyper: Mapping[str, Any],
    step: int,
    scale: float,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    *,
    overflow: bool,
    roundings: int,
    state_roundings: Mapping[str, int],
    device: str = "cpu",
) -> FailureRepro | None:
    """One step of torch's optimizer ``name`` (``flags``: foreach, fused) stepped by GradScaler,
    from the parameters, state and scaled gradients the run had at ``step`` (saved exactly; the
    smallest faithful part of a training run). Without overflow: against the update written out in
    float64, within gamma_k(2^-24) of it evaluated on magnitudes (k: ``roundings``, the state's
    ``state_roundings``). With a planted non-finite gradient: parameters and state bitwise as they
    were, nothing created but zeros, the scale halved. None for an optimizer with no reference."""
    family = "Adam" if name in ("Adam", "AdamW") else name
    if family not in _OPTIMIZER_REFERENCES:
        return None
    decayed = (
        "p * (1 - lr * wd), g, g.abs()  # decoupled: the parameter decays"
        if name == "AdamW"
        else "p, g + wd * p, g.abs() + wd * p.abs()  # L2: the gradient carries the decay"
    )
    reference = _OPTIMIZER_REFERENCES[family].format(
        name=name, decay="decoupled" if name == "AdamW" else "as L2", decayed=decayed
    )
    used = {k: v for k, v in state_roundings.items() if f'K_STATE["{k}"]' in reference}
    tensors, loaded = _loaded_step(
        params,
        grads,
        state,
        scale,
        f"torch.optim.{name}(params, **H, **{_dict_src(dict(flags))})",
        "GradScaler's step",
        device,
    )
    setup = f"""H = {_dict_src(dict(hyper))}  # the optimizer's hyperparameters; the state of step {step} of the run
{loaded}
scaler.step(opt)
scaler.update()
"""
    if overflow:
        code = f"""{setup}
# reference: a step with a non-finite gradient is skipped (nothing moves) and the scale is halved
wrong = untouched()
if scaler.get_scale() != SCALE * 0.5:
    wrong.append(f"the scale: {{scaler.get_scale()!r}} after the step, not {{SCALE * 0.5!r}}")
for w in wrong:
    print(f"the skipped step changed {{w}}")
measured = len(wrong)  # things the skipped step changed
allowed = 0"""
        allowance = "exact: a skipped step changes nothing (bitwise) and halves the scale"
    else:
        code = f"""{setup}
U = 2.0**-24  # float32's unit roundoff
K, K_STATE = {roundings}, {_dict_src(used)}  # roundings on the way to each result


def gamma(k):  # the bound on k float32 roundings: k u / (1 - k u)
    return k * U / (1 - k * U)


{reference}


ratios = []
for i, (p, p0, g, st) in enumerate(zip(params, P0, G, STATE)):
    new, budget, states = reference(p0.double(), g.double() / SCALE, {{k: v.double() for k, v in st.items()}})
    results = [("parameter", p.detach(), new, budget)] + [(k, opt.state[p].get(k), r, b) for k, (r, b) in states.items()]
    for entry, got, ref, bound in results:
        if got is None:
            print(f"parameter {{i}}: the step kept no {{entry}}")
            ratios.append(math.inf)
            continue
        err = (got.double() - ref).abs()
        ratio = float(torch.where(err == 0, 0.0, err / bound).max())  # NaN stays NaN
        if not ratio <= 1:
            print(f"parameter {{i}}, {{entry}}: worst error {{ratio:.3g}} x its budget")
        ratios.append(ratio)
measured = math.nan if any(r != r for r in ratios) else max(ratios)  # the worst error, in units of its budget
allowed = 1.0"""
        allowance = (
            f"gamma_k(2^-24) times the update evaluated on magnitudes, k = {roundings} roundings of torch's "
            f"{name} formula (state: its own roundings; step counts exact)"
        )
    return FailureRepro("scaler", what, code, allowance, tensors, device=device)


# -- distributed: ranks forked from the script (gloo on the CPU) --------------------------------
_DIST_PRELUDE = """import importlib
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = {world}  # ranks, forked from this process (they see its torch as it is): gloo on the CPU
{specs}


def resolve(spec):  # "module:function" -> the function
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def model():  # the distributed suite's model (seed 0)
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def batch(rank, n=8):  # each rank's inputs, drawn as the suite draws them
    g = torch.Generator().manual_seed(rank)
    return torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)


def grads(m):
    return [p.grad.detach().float().flatten() for p in m.parameters()]


{program}


def _rank(rank, workdir):
    dist.init_process_group("gloo", init_method=f"file://{{workdir}}/store", rank=rank, world_size=WORLD)
    try:
        torch.save(rank_program(rank), f"{{workdir}}/rank{{rank}}.pt")
    finally:
        dist.destroy_process_group()


with tempfile.TemporaryDirectory() as workdir:
    mp.start_processes(_rank, args=(workdir,), nprocs=WORLD, start_method="fork")
    ranks = [torch.load(f"{{workdir}}/rank{{r}}.pt", weights_only=True) for r in range(WORLD)]
U32 = 2.0**-24  # float32's unit roundoff


def gamma(k, u):  # the bound on k roundings of unit roundoff u: k u / (1 - k u)
    return k * u / (1 - k * u)


def reduce_in(g, u, eta):  # a reduce of WORLD gradients |g| (ranks x n) in a format of unit roundoff u
    per_rank = ((2 * u + u * u) * g / WORLD + 2 * eta).sum(0)  # its rounding and /WORLD on each rank
    return per_rank + gamma(WORLD - 1, u) * (1 + 2 * u) * (g / WORLD).sum(0)  # the sum of WORLD terms


def worst(pairs):  # the worst element over (got, expected, bound) pairs, in units of its bound
    ratios = [float(((got.double() - ref).abs() / bound).max()) for got, ref, bound in pairs]
    return math.nan if any(r != r for r in ratios) else max(ratios)
"""

_DDP_PROGRAM = """def rank_program(rank):  # one backward of DDP per communication path, and this rank's own gradients
    from torch.nn.parallel import DistributedDataParallel as DDP

    x, y = batch(rank)
    local = model()
    F.mse_loss(local(x), y).backward()
    out = {"local": grads(local)}
    for name, hook in (("plain", PLAIN_HOOK), ("hooked", HOOK)):
        ddp = DDP(model())
        if hook is not None:
            ddp.register_comm_hook(None, resolve(hook))
        F.mse_loss(ddp(x), y).backward()
        out[name] = grads(ddp.module)
    return out"""

_FSDP2_PROGRAM = """def rank_program(rank):  # FSDP2 (bf16 parameters, the reduce dtype) and the same bf16 computation unsharded
    import dataclasses

    from torch.distributed.fsdp import MixedPrecisionPolicy

    x, y = batch(rank)
    local = model().to(torch.bfloat16)
    F.mse_loss(local(x.to(torch.bfloat16)).float(), y).backward()
    inner = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=REDUCE_DTYPE, cast_forward_inputs=True)
    sharded = model()
    for layer in list(sharded.modules()):
        if isinstance(layer, torch.nn.Linear):
            resolve(SHARD)(layer, mp_policy=inner)
    resolve(SHARD)(sharded, mp_policy=dataclasses.replace(inner, output_dtype=torch.float32))
    F.mse_loss(sharded(x), y).backward()
    return {"local": grads(local), "averaged": [p.grad.full_tensor().float().flatten() for p in sharded.parameters()]}"""

_SCALER_PROGRAM = """def rank_program(rank):  # FSDP2 + fp16 autocast; for each rank in turn, an inf in that rank's shard only
    from torch.distributed.fsdp import fully_shard

    out = []
    for inf_rank in range(WORLD):
        sharded = model()
        fully_shard(sharded)
        opt = torch.optim.SGD(sharded.parameters(), lr=0.1)
        scaler = resolve(SCALER)("cpu")
        x, y = batch(rank)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(sharded(x).float(), y)
        scaler.scale(loss).backward()
        if rank == inf_rank:
            next(sharded.parameters()).grad._local_tensor.view(-1)[0] = math.inf
        before = [p._local_tensor.detach().clone() for p in sharded.parameters()]
        scaler.step(opt)
        scaler.update()
        stepped = any(not torch.equal(b, p._local_tensor) for b, p in zip(before, sharded.parameters()))
        out.append([stepped, float(scaler.get_scale())])
    return out"""


_AMP_TRAINING_PROGRAM = """STEPS, B = 6, 16  # steps, samples of the global batch (each rank takes its share)


def global_batch(step):  # the global batch of a step, drawn as the suite draws it
    g = torch.Generator().manual_seed(1000 * step)
    return torch.randn(B, 16, generator=g), torch.randn(B, 4, generator=g)


def amp_loop(m, take, reduce_loss):  # SGD under fp16 autocast and GradScaler: losses, first step's gradients
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    losses, first = [], None
    for s in range(STEPS):
        x, y = take(s)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(m(x).float(), y)
        scaler.scale(loss).backward()
        scale = float(scaler.get_scale())
        grads = [p.grad.detach().double().flatten() / scale for p in m.parameters()]
        if first is None and all(bool(g.isfinite().all()) for g in grads):
            first = torch.cat(grads)
        scaler.step(opt)
        scaler.update()
        losses.append(reduce_loss(loss.detach().item()))
    return {"losses": torch.tensor(losses, dtype=torch.float64), "first": first}


def rank_program(rank):  # DDP over the ranks' shares of every global batch
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model())
    if HOOK is not None:
        ddp.register_comm_hook(None, resolve(HOOK))

    def mean_all(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / WORLD

    return amp_loop(ddp, lambda s: tuple(t.chunk(WORLD)[rank] for t in global_batch(s)), mean_all)"""


_F8_GATHER_PROGRAM = """BATCH, WIDTH, HIDDEN = 32, 32, 64  # global batch, features: every weight shard is whole rows


def train(rank, all_gather):  # the float8 MLP (torchao, tensorwise) sharded by SHARD, as the suite trains it
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao's CUDA-only extensions do not load on a CPU host
        from torchao import float8
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    )
    config = float8.Float8LinearConfig(emulate=EMULATE, enable_fsdp_float8_all_gather=all_gather)
    float8.convert_to_float8_training(m, config=config)
    for layer in m:
        if type(layer).__name__ == "Float8Linear":
            resolve(SHARD)(layer)
    resolve(SHARD)(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
        loss = F.mse_loss(m(x.chunk(WORLD)[rank]), y.chunk(WORLD)[rank])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / WORLD)
    local = [p.to_local().detach() for p in m.parameters()]
    shards = [getattr(t, "_tensor", t).float().flatten() for t in local]  # all-gather wraps a shard
    return {"losses": torch.tensor(losses, dtype=torch.float64), "shards": shards}


def rank_program(rank):  # without, then with float8 all-gather
    return {"plain": train(rank, False), "all_gather": train(rank, True)}"""


def distributed(
    what: str,
    check: str,
    world: int,
    specs: Mapping[str, str | None],
    fmt_name: str | None = None,
    settings: Mapping[str, object] | None = None,
) -> FailureRepro | None:
    """A distributed check as a script whose ``world`` ranks are forked from it (gloo, CPU): the
    rank program and the suite's model and inputs written out, the implementations under test by
    ``module:function`` name (``specs``: torch's own, or a module of yours the script then needs),
    the budget derived inline as the check derives it. ``check``: ``ddp_compression`` (the hooked
    path against DDP's plain all-reduce), ``ddp_allreduce`` (DDP's plain path against the exact mean
    of the ranks' own gradients), ``fsdp2_reduce`` (FSDP2's reduced gradient against that mean),
    ``sharded_scaler`` (an inf on any one rank: every rank skips, one scale), ``float8_all_gather``
    (torchao's float8 MLP under FSDP2 without and with float8 all-gather: bit for bit; ``settings``:
    ``STEPS`` and ``EMULATE``)."""
    fmt = format_of(getattr(torch, fmt_name)) if fmt_name else None
    lines = []
    for name, spec in specs.items():
        lines.append(f"{name} = {spec!r}")
    lines += [f"{name} = {value!r}" for name, value in (settings or {}).items()]
    if check in ("ddp_compression", "ddp_allreduce"):
        program = _DDP_PROGRAM
        if check == "ddp_compression":
            assert fmt is not None
            reference = f"""# reference: DDP's plain fp32 all-reduce; budget: {fmt.name} rounding and /WORLD per rank, gamma_(WORLD-1)
# sum in {fmt.name}, plus gamma_WORLD(2^-24) of the fp32 reference (as the check derives it)
U, ETA = {fmt.unit_roundoff!r}, {fmt.smallest_subnormal / 2!r}  # {fmt.name}: unit roundoff, half its smallest subnormal
pairs = []
for i in range(len(ranks[0]["local"])):
    g = torch.stack([r["local"][i] for r in ranks]).double().abs()
    bound = reduce_in(g, U, ETA) + gamma(WORLD, U32) * (g / WORLD).sum(0)
    pairs += [(r["hooked"][i], r["plain"][i].double(), bound) for r in ranks]"""
        else:
            reference = """# reference: the exact mean of the ranks' own gradients (float64); budget gamma_WORLD(2^-24) mean|g|
# plus float32's smallest subnormal, as the check derives it
pairs = []
for i in range(len(ranks[0]["local"])):
    g = torch.stack([r["local"][i] for r in ranks]).double()
    bound = gamma(WORLD, U32) * g.abs().mean(0) + 2.0**-149
    pairs += [(r["plain"][i], g.mean(0), bound) for r in ranks]"""
        reference += """
measured = worst(pairs)  # the worst element, in units of its bound
allowed = 1.0"""
    elif check == "fsdp2_reduce":
        assert fmt is not None
        program = _FSDP2_PROGRAM
        lines.append(f"REDUCE_DTYPE = torch.{fmt_name}  # the declared reduce dtype")
        own = (
            "gamma(WORLD, U32) * g.abs().mean(0) + 2.0**-149  # fp32: gamma_WORLD(2^-24) mean|g|"
            if fmt_name == "float32"
            else f"reduce_in(g.abs(), {fmt.unit_roundoff!r}, {fmt.smallest_subnormal / 2!r})  # {fmt.name}"
        )
        reference = f"""# reference: the exact mean of the ranks' own bf16 gradients (float64); budget: the declared
# reduce dtype's, as the check derives it
pairs = []
for i in range(len(ranks[0]["local"])):
    g = torch.stack([r["local"][i] for r in ranks]).double()
    bound = {own}
    pairs.append((ranks[0]["averaged"][i], g.mean(0), bound))
measured = worst(pairs)  # the worst element, in units of its bound
allowed = 1.0"""
    elif check == "ddp_amp_training":
        program = _AMP_TRAINING_PROGRAM
        reference = """single = amp_loop(model(), global_batch, lambda v: v)  # the same training in one process
# reference: one process. The first step's gradients (same weights) within the reordered batch's
# roundings: each sample's contribution through at most 4 fp16 roundings per module (5 modules) and
# one in the batch sum, gamma_(B + 20)(2^-11) x sum_i |g_i| (per-sample gradients in float64); the
# losses within gamma_(B x (s+1))(2^-11) |L_s| (the same reordering, compounded over the steps)
U16 = 2.0**-11
m64 = model().double()
x0, y0 = global_batch(0)
magnitudes = 0
for i in range(B):
    m64.zero_grad()
    (F.mse_loss(m64(x0[i : i + 1].double()), y0[i : i + 1].double()) / B).backward()
    magnitudes = magnitudes + torch.cat([p.grad.flatten().abs() for p in m64.parameters()])
pairs = []
for r in ranks:
    pairs.append((r["first"], single["first"], gamma(B + 4 * 5, U16) * magnitudes))
    steps = torch.arange(1, STEPS + 1, dtype=torch.float64)
    bound = torch.tensor([gamma(int(B * s), U16) for s in steps.tolist()], dtype=torch.float64) * single["losses"].abs()
    pairs.append((r["losses"], single["losses"], bound))
measured = worst(pairs)  # the worst element, in units of its bound
allowed = 1.0"""
    elif check == "sharded_scaler":
        program = _SCALER_PROGRAM
        reference = """# reference: an inf on any one rank makes every rank skip the step with the same scale
wrong = 0
for case in range(WORLD):
    stepped = [r[case][0] for r in ranks]
    scales = [r[case][1] for r in ranks]
    if any(stepped) or len(set(scales)) != 1:
        print(f"inf only on rank {case}: ranks {[r for r, s in enumerate(stepped) if s]} stepped; scales {scales}")
        wrong += 1
measured = wrong  # cases where a rank stepped or the scales differ
allowed = 0"""
    elif check == "float8_all_gather":
        program = _F8_GATHER_PROGRAM
        reference = """# reference: the same training without float8 all-gather, bit for bit (torchao promises it)
wrong = 0
for r, out in enumerate(ranks):
    plain, gathered = out["plain"], out["all_gather"]
    if not torch.equal(plain["losses"], gathered["losses"]):
        print(f"rank {r}: losses without {plain['losses'].tolist()}, with {gathered['losses'].tolist()}")
        wrong += 1
    for i, (a, b) in enumerate(zip(plain["shards"], gathered["shards"])):
        if not torch.equal(a, b):
            print(f"rank {r}, parameter {i}: final shards differ by up to {float((a - b).abs().max())!r}")
            wrong += 1
measured = wrong  # losses and final weight shards unlike the run without it
allowed = 0"""
    else:
        return None
    prelude = _DIST_PRELUDE.format(world=world, specs="\n".join(lines), program=program)
    needs = sorted(
        {"torch", *(s.partition(":")[0].split(".")[0] for s in specs.values() if s)}
        | ({"torchao"} if check == "float8_all_gather" else set())
    )
    return FailureRepro("distributed", what, prelude + "\n" + reference, _DIST_ALLOWANCE[check], needs=tuple(needs))


_DIST_ALLOWANCE = {
    "ddp_compression": "the compression format's rounding and /W per rank, gamma_(W-1) of its sum, gamma_W(2^-24) of "
    "the fp32 reference",
    "ddp_allreduce": "gamma_W(2^-24) mean|g|: an fp32 reduce of W gradients",
    "fsdp2_reduce": "the declared reduce dtype's: its rounding and /W per rank and gamma_(W-1) of its sum (fp32: "
    "gamma_W(2^-24) mean|g|)",
    "sharded_scaler": "exact: a skipped step on every rank, one scale",
    "float8_all_gather": "exact: torchao promises identical numerics with float8 all-gather",
    "ddp_amp_training": "the batch reduced in another order: gamma_(B + 4 x modules)(2^-11) sum_i |g_i| of the first "
    "step's gradients, gamma_(B x steps)(2^-11) |L| of the losses",
}


def clip_step(
    what: str,
    kind: str,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Mapping[int, Mapping[str, torch.Tensor]],
    scale: float,
    max_norm: float,
    foreach: bool,
    *,
    device: str = "cpu",
) -> FailureRepro:
    """One ``unscale_`` -> ``clip_grad_norm_`` -> ``step`` of the clipping suite's SGD (momentum)
    from the saved parameters, state and scaled gradients. ``kind``: ``float64`` (the returned norm
    and the clipped gradients against clipping's definition in float64, within gamma_(n+1) and
    gamma_(n+4) of float32's unit roundoff), ``non_finite`` (a planted inf/NaN: a non-finite norm,
    the step skipped bitwise, the scale halved) or ``error_if_nonfinite`` (a non-finite norm
    raises and keeps the gradients; a finite one never raises)."""
    tensors, loaded = _loaded_step(
        params, grads, state, scale, "torch.optim.SGD(params, lr=0.05, momentum=0.9)", "unscale_", device
    )
    setup = f"""MAX_NORM, FOREACH = {max_norm!r}, {foreach!r}
{loaded}
scaler.unscale_(opt)
"""
    if kind == "float64":
        code = f"""{setup}
norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH))
# reference: clipping by its definition in float64 from the gradients unscaled exactly (SCALE is a
# power of two): norm = sqrt(sum g^2), coefficient min(1, max_norm / (norm + 1e-6))
g64 = [g.double() / SCALE for g in G]
n = sum(g.numel() for g in g64)
ref_norm = math.sqrt(sum(float((g * g).sum()) for g in g64))
coef = min(1.0, MAX_NORM / (ref_norm + 1e-6))
U = 2.0**-24  # float32's unit roundoff


def gamma(k):  # the bound on k float32 roundings
    return k * U / (1 - k * U)


# budgets: the norm's n squares, n - 1 sums and root (gamma_(n+1)); each gradient adds the
# coefficient's sum and quotient and the product (gamma_(n+4)), plus float32's smallest subnormal
ratios = [abs(norm - ref_norm) / (gamma(n + 1) * ref_norm)]
print(f"total norm: torch {{norm!r}}, float64 {{ref_norm!r}} (coefficient {{coef:.6g}})")
for i, (p, g) in enumerate(zip(params, g64)):
    ref = g * coef
    ratios.append(float(((p.grad.double() - ref).abs() / (gamma(n + 4) * ref.abs() + 2.0**-149)).max()))
measured = math.nan if any(r != r for r in ratios) else max(ratios)  # the worst error, in units of its budget
allowed = 1.0"""
        allowance = "gamma_(n+1)(2^-24) of the norm; gamma_(n+4)(2^-24) |clipped| of each gradient"
    elif kind == "non_finite":
        code = f"""{setup}
norm = float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH))
scaler.step(opt)
scaler.update()
# reference: an inf/NaN gradient has a non-finite norm (never a finite sentinel), GradScaler skips
# the step (nothing moves, bitwise) and halves the scale
wrong = [f"clip_grad_norm_ returned a finite norm {{norm!r}}"] if math.isfinite(norm) else []
wrong += [f"the skipped step changed {{w}}" for w in untouched()]
if scaler.get_scale() != SCALE * 0.5:
    wrong.append(f"the scale went {{SCALE!r}} -> {{scaler.get_scale()!r}}, not halved")
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0"""
        allowance = "exact: a non-finite norm, nothing moved, the scale halved"
    else:
        code = f"""{setup}
kept = [p.grad.clone() for p in params]
planted = any(not bool(g.isfinite().all()) for g in G)
try:
    torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=FOREACH, error_if_nonfinite=True)
    raised = None
except RuntimeError as exc:
    raised = str(exc).splitlines()[0]
if raised is None:
    scaler.step(opt)
scaler.update()
# reference: error_if_nonfinite=True raises on a non-finite norm with the gradients as they were
# (and the step is skipped); with finite gradients it never raises
wrong = []
if planted and raised is None:
    wrong.append("a non-finite gradient, and no error raised")
if not planted and raised is not None:
    wrong.append(f"finite gradients, yet clip_grad_norm_ raised: {{raised}}")
if planted and not all(same(p.grad, k) for p, k in zip(params, kept)):
    wrong.append("the gradients changed although clipping refused")
if planted:
    wrong += [f"the skipped step changed {{w}}" for w in untouched()]
for w in wrong:
    print(w)
measured = len(wrong)  # promises broken
allowed = 0"""
        allowance = "exact: a non-finite norm raises, the gradients and the step untouched; a finite one never raises"
    return FailureRepro("scaler", what, code, allowance, tensors, device=device)
