"""Compiled AMP's claims, standalone: ops' output dtypes under autocast through ``torch.compile``
against eager's; the probe block (linear, layer_norm, attention, gelu, softmax, loss) compiled
under autocast, every stage and gradient's dtype against eager's and its error against float64
beyond eager's within the budget the harness derived; and a region with autocast disabled inside
autocast, compiled, in fp32 as eager runs it.

amp-harness writes a failed check's captured calls, the probe block's or region's source (the
harness's own), weights, inputs and values over the defaults below and keeps the blocks it needs
(``harness.domains.compiled.repro``), compiled with Inductor as users get it. As it lies here a
smaller block stands in for the probe and everything is compiled with the ``eager`` backend
(Dynamo's capture, no code generation), so that the file runs in seconds.
"""

import copy
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._functorch.config
import torch._inductor.config
import torch.nn.functional as F
from torch import nn

# -- cases --
_gen = torch.Generator().manual_seed(0)
c0_x0, c0_x1 = torch.randn(4, 4, generator=_gen), torch.randn(4, 4, generator=_gen)


def case_0(x0: torch.Tensor, x1: torch.Tensor) -> torch.Tensor:
    return torch.mm(x0, x1).softmax(-1)


def observe(run: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> str:  # the output dtype, or the error
    torch.manual_seed(0)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = run(*inputs)
    except RuntimeError as exc:
        return "raises: " + (str(exc).strip().splitlines() or [""])[0]
    return "no error" if out is None else str(out.dtype).removeprefix("torch.")


CASES = [("mm then softmax", case_0, [c0_x0, c0_x1])]

# -- dtypes --
BACKEND = "eager"  # torch.compile's backend
measured: float = 0
for label, run, inputs in CASES:
    eager_seen = observe(run, inputs)  # reference: the same calls, eager, under the same autocast
    torch._dynamo.reset()  # each op compiled on its own, as the check compiles it
    compiled_seen = observe(torch.compile(run, backend=BACKEND), inputs)
    differs = "" if compiled_seen == eager_seen else "   <- differs"
    print(f"{label}: compiled {compiled_seen}, eager {eager_seen}{differs}")
    measured += compiled_seen != eager_seen  # ops whose compiled output dtype is not eager's
allowed: float = 0

# -- block_model --
Tap = object  # the probe's annotation: the reproduction never taps its stages


def _identity(name: str, value: torch.Tensor) -> torch.Tensor:
    return value


class Block(nn.Module):  # the default's stand-in for the probe block: linear -> layer_norm -> logits -> loss
    def __init__(self, width: int = 16, heads: int = 1, classes: int = 8) -> None:
        super().__init__()
        self.inp, self.norm, self.head = nn.Linear(width, width), nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor, tap: Any = None) -> dict[str, torch.Tensor]:
        out = {"linear": self.inp(x)}
        out["layer_norm"] = self.norm(out["linear"])
        out["logits"] = logits = self.head(out["layer_norm"])
        out["loss"] = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        return out


# -- block_inputs --
_gen = torch.Generator().manual_seed(1)
x, y = torch.randn(2, 8, 16, generator=_gen), torch.randint(0, 8, (2, 8), generator=_gen)
torch.manual_seed(0)
STATE = Block().state_dict()

# -- block_opening --
BLOCK_ARGS = (16, 1, 8)  # width, heads, classes
DTYPE = torch.bfloat16  # the autocast dtype
BACKEND = "eager"  # torch.compile's backend (Inductor: what a user gets)
INDUCTOR_CONFIG: dict[str, Any] = {}  # Inductor's configuration of the compile (a variant's switches)
model = Block(*BLOCK_ARGS).to(x.device)
model.load_state_dict(STATE)
Found = dict[str, torch.Tensor]


def call_block(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    return m(x, y)


def observe_block(fn: Callable[..., Any], m: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: Any) -> Found:
    """Forward under autocast, backward outside it (as the docs say): every stage and gradient."""
    m.zero_grad(set_to_none=True)
    x = x.detach().requires_grad_()
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        out = fn(m, x, y)
    torch.autograd.backward(out["loss"])
    found = {f"forward.{k}": v.detach() for k, v in out.items()}
    found.update({f"grad.{n}": p.grad.detach() for n, p in m.named_parameters() if p.grad is not None})
    if x.grad is not None:
        found["grad.input"] = x.grad.detach()
    return found


eager = observe_block(call_block, model, x, y, DTYPE)
torch._dynamo.reset()
with torch._inductor.config.patch(INDUCTOR_CONFIG):
    compiled = observe_block(torch.compile(call_block, backend=BACKEND), model, x, y, DTYPE)

# -- block_numerics --
ref = observe_block(call_block, copy.deepcopy(model).double(), x.double(), y, None)  # the float64 reference


def error(v: torch.Tensor, k: str) -> float:  # max |v - fp64| / max |fp64|
    scale = float(ref[k].abs().max())
    diff = float((v.double() - ref[k]).abs().max())
    return diff / scale if scale > 0 else diff


# per quantity, relative to max |fp64|: one low-precision rounding at each op boundary, propagated
# through the block in float64 (amp-harness derives it from the format's unit roundoff)
ALLOWANCE = {"forward.linear": 2.0**-7, "forward.loss": 2.0**-6}
ratios = {k: (error(compiled[k], k) - error(eager[k], k)) / a for k, a in ALLOWANCE.items()}
for k in sorted(ratios, key=lambda k: -ratios[k])[:4]:
    said = f"compiled error {error(compiled[k], k):.3g}, eager {error(eager[k], k):.3g}"
    print(f"{k}: {said}, ({ratios[k]:.3g}x its budget)")
measured = max(ratios.values())  # the worst quantity's excess over eager, in units of its budget
allowed = 1.0

# -- block_dtypes --
# reference: eager's dtypes (autocast's policy, as eager applies it)
differ = [k for k in eager if k not in compiled or compiled[k].dtype != eager[k].dtype]
for k in differ:
    print(f"{k}: compiled {compiled[k].dtype if k in compiled else 'missing'}, eager {eager[k].dtype}")
measured = len(differ)  # stages and gradients whose dtype differs from eager's
allowed = 0

# -- region_model --
WIDTH = 16


class Region(nn.Module):
    """A low-precision linear layer, then an fp32 linear layer with autocast disabled."""

    def __init__(self) -> None:
        super().__init__()
        self.low = nn.Linear(WIDTH, WIDTH)
        self.fp32 = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.low(x)
        with torch.autocast(x.device.type, enabled=False):
            out = self.fp32(h.float())
        return h, out


# -- region_inputs --
x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(2))
torch.manual_seed(0)
STATE = Region().state_dict()
# one fp32 evaluation's bound of the region's output: WIDTH roundings of each product's terms
bound_out = (WIDTH * 2.0**-24) * torch.ones(8, WIDTH) * 8

# -- region --
DTYPE = torch.bfloat16  # the autocast dtype
BACKEND = "eager"  # torch.compile's backend
VARIANT = "default"  # the compile's configuration
FUNCTORCH: dict[str, Any] = {}  # its torch._functorch.config patch
INDUCTOR: dict[str, Any] = {}  # its torch._inductor.config patch
region = Region().to(x.device)
region.load_state_dict(STATE)


def call_region(m: nn.Module, x: torch.Tensor) -> Any:
    return m(x)


def run_region(fn: Callable[..., Any]) -> dict[str, torch.Tensor]:  # forward under autocast, backward outside
    region.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=DTYPE):
        _, out = fn(region, x)
    torch.autograd.backward(out.float().sum())
    found = {"forward.out": out.detach()}
    found.update({f"grad.{n}": p.grad.detach() for n, p in region.named_parameters() if p.grad is not None})
    return found


eager = run_region(call_region)
torch._dynamo.reset()
with torch._functorch.config.patch(FUNCTORCH), torch._inductor.config.patch(INDUCTOR):
    compiled = run_region(torch.compile(call_region, backend=BACKEND))
# reference: eager (the region in fp32); each of eager and compiled is within one fp32 evaluation
# bound of the exact products of the same inputs, so they differ by at most twice that bound
BOUNDS = {"forward.out": bound_out}
measured = 0.0
for k, bound in BOUNDS.items():
    if compiled[k].dtype != eager[k].dtype:
        print(f"{k}: compiled {compiled[k].dtype}, eager {eager[k].dtype}")
        measured = math.inf
    ratio = float(((compiled[k].double() - eager[k].double()).abs() / (2 * bound)).max())
    print(f"{k}: |compiled - eager| is {ratio:.3g}x twice the fp32 bound ({VARIANT})")
    measured = max(measured, ratio)  # the worst, in units of its allowance (a dtype change: inf)
allowed = 1.0

# -- scalars --
# A Python scalar meets an autocast region's low-precision output. Each case's input sits at the
# scalar rounded to the tensor's dtype (1.7 -> 1.703125 in bf16), where CPU eager's rounding of the
# scalar decides a mask, a gradient or a remainder. Reference: eager, the same program uncompiled.
SCALAR_DTYPE = torch.bfloat16
SCALAR_BACKEND = "eager"  # torch.compile's backend (amp-harness writes "inductor")
JUDGED = ["gt", "eq", "sub_relu_mask", "clamp_add_grad", "margin_ranking_grad", "fmod", "remainder"]
S = 1.7
r = torch.tensor(S, dtype=torch.float64).to(SCALAR_DTYPE).item()  # the inputs' value
FACTORS = {
    "gt": 1,
    "eq": 1,
    "sub_relu_mask": 1,
    "clamp_add_grad": -1,
    "margin_ranking_grad": 1,
    "fmod": 2,
    "remainder": -2,
}


def scalar_program(x: torch.Tensor, eye: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.autocast(x.device.type, dtype=SCALAR_DTYPE):
        h = (x[None, :] @ eye)[0]  # x's values, in the autocast dtype
    g = {name: h[i : i + 1] for i, name in enumerate(FACTORS)}
    one = torch.ones_like(g["margin_ranking_grad"])
    return {
        "gt": g["gt"] > S, "eq": g["eq"] == S, "sub_relu_mask": torch.relu(g["sub_relu_mask"] - S) > 0,
        "clamp_add_grad": torch.clamp_min(g["clamp_add_grad"] + S, 0).sum(),
        "margin_ranking_grad": F.margin_ranking_loss(g["margin_ranking_grad"], 0 * one, one, margin=S),
        "fmod": torch.fmod(g["fmod"], S), "remainder": torch.remainder(g["remainder"], S),
    }  # fmt: skip


def scalar_values(run: Callable[..., dict[str, torch.Tensor]]) -> dict[str, float]:  # values; gradients
    x_s = torch.tensor([f * r for f in FACTORS.values()], requires_grad=True)
    outs = run(x_s, torch.eye(len(FACTORS)))
    (grad_s,) = torch.autograd.grad(outs["clamp_add_grad"] + outs["margin_ranking_grad"], x_s)
    return {
        n: float(grad_s[i]) if n.endswith("_grad") else float(outs[n].detach().float()[0])
        for i, n in enumerate(FACTORS)
    }


eager_s = scalar_values(scalar_program)
torch._dynamo.reset()
compiled_s = scalar_values(torch.compile(scalar_program, backend=SCALAR_BACKEND))
wrong = [n for n in JUDGED if compiled_s[n] != eager_s[n]]
for n in JUDGED:
    said = f"compiled {compiled_s[n]!r}, eager {eager_s[n]!r}"
    print(f"{n} at {FACTORS[n] * r!r}: {said}{'   <- differs' if n in wrong else ''}")
measured = len(wrong)  # cases whose compiled value is not eager's
allowed = 0
