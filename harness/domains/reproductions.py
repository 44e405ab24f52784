"""Standalone reproductions of the registered known issues: scripts that need only torch (and
torchao where the issue is torchao's), never this harness, so they can be attached to a bug report.

Each body seeds its inputs, runs the computation under test, computes its reference inline
(float64, exact bit arithmetic, or the stack's own documented rule) with the allowance and its
origin, prints measured against allowed, and exits 1 while the defect is present, 0 once fixed.
:func:`script` puts a header on a body: the issue, where it is registered, the versions and the
hardware the script was written on. Each entry also carries the edit that stands for the upstream
fix (``fixed``), with which the harness's own tests show the script exits 0: a reproduction that
cannot report "fixed" would keep a fixed issue open forever.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from harness.domains.compiled.known_issues import KNOWN_ISSUES as COMPILED
from harness.domains.fp8.known_issues import KNOWN_ISSUES as FP8
from harness.domains.scaling.reference import KNOWN_ISSUES as SCALING
from harness.domains.versions import KnownIssue

#: Every registered known issue, by id, and the registry it is in.
REGISTRIES: dict[str, tuple[str, KnownIssue]] = {
    **{k: ("harness/domains/scaling/reference.py", v) for k, v in SCALING.items()},
    **{k: ("harness/domains/compiled/known_issues.py", v) for k, v in COMPILED.items()},
    **{k: ("harness/domains/fp8/known_issues.py", v) for k, v in FP8.items()},
}


@dataclass(frozen=True)
class Reproduction:
    """One issue's script body, what it imports, the edit standing for its fix, and whether it
    compiles (Inductor: seconds per run on a small CPU)."""

    issue: str
    needs: tuple[str, ...]
    body: str
    fixed: tuple[str, str]
    compiles: bool = False

    def fixed_body(self) -> str:
        """The body with the fix applied (the control that the script can say "fixed")."""
        old, new = self.fixed
        if self.body.count(old) != 1:
            raise ValueError(f"{self.issue}: the fix's anchor {old!r} must occur once in the body")
        return self.body.replace(old, new, 1)


UPDATE_INT_NEW_SCALE = 'import sys\n\nimport torch\n\n# GradScaler.update(new_scale) documents "new_scale (float or torch.Tensor)"; a Python int is a number\n# the user means exactly: update(1024) must do what update(1024.0) does.\nscaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)\np = torch.nn.Parameter(torch.ones(4))\nopt = torch.optim.SGD([p], lr=0.1)\nscaler.scale((p * 2).sum()).backward()\nscaler.step(opt)\nexpected = 1024.0  # the reference: the float the int names\ntry:\n    scaler.update(1024)\n    measured = f"scale {scaler.get_scale()!r}"\n    defect = scaler.get_scale() != expected\nexcept Exception as e:\n    measured, defect = f"{type(e).__name__}: {e}", True\nprint(f"update(1024): {measured}; expected scale {expected!r} (allowance: exact)")\nsys.exit(1 if defect else 0)\n'

UPDATE_BEFORE_SCALE_AFTER_LOAD = 'import sys\n\nimport torch\n\n# A GradScaler restored with load_state_dict() holds the saved scale; update(new_scale) right after\n# restoring must set it, as it does on the scaler that was saved.\nsaved = torch.amp.GradScaler("cpu", init_scale=2.0**10)\nrestored = torch.amp.GradScaler("cpu")\nrestored.load_state_dict(saved.state_dict())\nexpected = 512.0\ntry:\n    restored.update(new_scale=512.0)\n    measured = f"scale {restored.get_scale()!r}"\n    defect = restored.get_scale() != expected\nexcept Exception as e:\n    measured, defect = f"{type(e).__name__}: {e}", True\nprint(f"update(512.0) after load_state_dict(): {measured}; expected scale {expected!r} (allowance: exact)")\nsys.exit(1 if defect else 0)\n'

SHARDED_CPU_GROWTH_UNCAPPED = 'import sys\n\nimport torch\nimport torch.distributed as dist\nfrom torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler\n\n# torch.amp.GradScaler does not apply a growth that would overflow float32 (the scale stays finite);\n# ShardedGradScaler on the CPU must follow the same rule. One clean step at 2^126 with growth x4:\n# 2^128 is not a float32, so the scale must stay 2^126.\ndist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)\nscaler = ShardedGradScaler("cpu", init_scale=2.0**126, growth_factor=4.0, growth_interval=1)\np = torch.nn.Parameter(torch.ones(2))\nopt = torch.optim.SGD([p], lr=0.0)\nscaler.scale(p.sum()).backward()\nscaler.step(opt)\nscaler.update()\nmeasured = scaler.get_scale()\nexpected = 2.0**126  # reference: growth applied only while the product stays finite in float32\ndist.destroy_process_group()\nprint(f"ShardedGradScaler scale after one clean step: {measured!r}; expected {expected!r} (allowance: exact)")\nsys.exit(1 if measured != expected else 0)\n'

FUSED_SGD_FIRST_STEP_OVERFLOW_KEEPS_UNINITIALISED_MOMENTUM = 'import math\nimport sys\n\nimport torch\n\n# SGD(momentum, fused=True) stepped by GradScaler: the first step overflows and is skipped. The next\n# step must start the momentum buffer from that step\'s gradient, as the for-loop SGD does: the\n# parameters after it are finite. The buffer left by the skipped step is filled with NaN (what\n# uninitialised memory may hold) to make the outcome deterministic.\np = torch.nn.Parameter(torch.ones(4))\nsgd = torch.optim.SGD([p], lr=0.1, momentum=0.9, fused=True)\nscaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)\nfor t in range(2):\n    sgd.zero_grad(set_to_none=True)\n    scaler.scale((p * 2).sum()).backward()\n    if t == 0:\n        p.grad.view(-1)[0] = math.inf\n    scaler.step(sgd)\n    scaler.update()\n    if t == 0:\n        buf = sgd.state.get(p, {}).get("momentum_buffer")\n        if isinstance(buf, torch.Tensor):\n            buf.fill_(math.nan)\nexpected = 1.0 - 0.1 * 2.0  # reference: one SGD step from a fresh buffer, p - lr * g, in float64\nallowance = 4 * 2.0**-24  # float32\'s roundings of lr * g and the subtraction, on values <= 1 (2 u each)\nerror = max(abs(v - expected) if math.isfinite(v) else math.inf for v in p.detach().tolist())\nprint(f"step after a skipped first step: |p - {expected}| = {error!r}; allowed {allowance!r} (float32 roundings)")\nsys.exit(0 if error <= allowance else 1)\n'

COMPILED_BACKWARD_UNDER_FORWARD_AUTOCAST = 'import sys\n\nimport torch\nfrom torch import nn\n\n# A region with autocast disabled inside an autocast forward runs in fp32; with backward() called\n# outside autocast its backward must be fp32 too, compiled as in eager. Reference: the fp32 layer\'s\n# weight gradient, sum over rows of its input h (d sum(out) / d out = 1), in float64 from the h the\n# compiled forward itself produced; allowance: float32\'s evaluation of that sum, gamma_n(2^-24) sum|h|.\ntorch.manual_seed(0)\nROWS, WIDTH = 64, 64\n\n\nclass Region(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.low, self.fp32 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)\n\n    def forward(self, x):\n        h = self.low(x)\n        with torch.autocast("cpu", enabled=False):\n            return h, self.fp32(h.float())\n\n\nmodel = Region()\nx = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(2000))\ncompiled = torch.compile(model)\nwith torch.autocast("cpu", dtype=torch.bfloat16):\n    h, out = compiled(x)\nout.float().sum().backward()\nh64 = h.detach().double()\nreference = h64.sum(0).expand(WIDTH, WIDTH)  # d/dW of sum(h W^T + b): every row is sum_i h_i\nu = 2.0**-24\ngamma = ROWS * u / (1 - ROWS * u)\nallowance = gamma * h64.abs().sum(0).expand(WIDTH, WIDTH)\nratio = float(((model.fp32.weight.grad.double() - reference).abs() / allowance).max())\nprint(f"compiled region\'s fp32 weight gradient: worst error {ratio:.3g} x its float32 budget (allowed 1)")\nsys.exit(1 if ratio > 1 else 0)\n'

INDUCTOR_ELIDES_EAGER_ROUNDINGS = "import sys\n\nimport torch\n\n# Under autocast, eager rounds every op's output to the autocast dtype. A chain of pointwise ops on\n# a bf16 matmul's output, compiled, must give eager's bits (Inductor keeps fused intermediates in\n# fp32 unless torch._inductor.config.emulate_precision_casts = True). Reference: eager, op by op.\ntorch.manual_seed(0)\nx, w = torch.randn(64, 64), torch.randn(64, 64)\n\n\ndef block(x, w):\n    y = x @ w  # bf16 under autocast\n    return (torch.tanh(y) * 1.7 + y).sigmoid() * y\n\n\nwith torch.autocast(\"cpu\", dtype=torch.bfloat16):\n    eager = block(x, w)\n    compiled = torch.compile(block)(x, w)\ndiffer = int((eager.float() != compiled.float()).sum())\nprint(\n    f\"compiled vs eager under bf16 autocast: {differ} of {eager.numel()} elements differ (allowed 0: eager's roundings)\"\n)\nsys.exit(1 if differ else 0)\n"

TORCHAO_POW2_SCALE_ROUNDS_UP = "import math\nimport sys\n\nimport torch\nfrom torchao.float8 import float8_utils\n\n# torchao's power-of-two scale must be the largest power of two not above the exact scale\n# fp8_max / amax (rounding the scale down keeps amax x scale <= fp8_max). For an amax whose exact\n# scale is just below 32, that power is 16.\nFP8_MAX = 448.0  # float8_e4m3fn's largest finite value\namax = FP8_MAX / (32.0 * (1 - 2.0**-24))\nexact_scale = FP8_MAX / amax  # float64: 32 (1 - 2^-24), exact\nm, e = math.frexp(exact_scale)  # exact_scale = m 2^e, 0.5 <= m < 1\nexpected = 2.0 ** (e - 1)  # the power-of-two floor, from the bits: no log2 rounding\ngot = float(float8_utils.amax_to_scale(torch.tensor(amax), torch.float8_e4m3fn, round_scales_to_power_of_2=True))\nprint(f\"amax {amax!r}: torchao scale {got!r}; exact power-of-two floor {expected!r} (allowance: exact)\")\nsys.exit(1 if got != expected else 0)\n"

TORCHAO_RCEIL_SCALE_NEAR_POWER_OF_2 = 'import math\nimport sys\n\nimport torch\nfrom torchao.prototype.mx_formats import config, mx_tensor\n\n# MX RCEIL: the e8m0 block scale is 2^ceil(log2(amax / elem_max)), stored as the biased exponent\n# code (bias 127). For a block amax just above elem_max x 2^-100 the exact code is 127 - 100 + 1.\nELEM_MAX = 448.0  # float8_e4m3fn\nBLOCK = 32\namax = ELEM_MAX * 2.0**-100 * (1 + 2.0**-23)\nx = torch.tensor([amax] + [0.0] * (BLOCK - 1), dtype=torch.float32)\ncodes, _ = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=config.ScaleCalculationMode.RCEIL)\ngot = int(codes.view(torch.uint8).flatten()[0])\nratio = amax / ELEM_MAX  # float64, exact: 2^-100 (1 + 2^-23)\nm, e = math.frexp(ratio)  # ratio = m 2^e, 0.5 <= m < 1\nceil_log2 = e - 1 if m == 0.5 else e  # the exact ceiling of log2, from the bits\nexpected = 127 + ceil_log2\nprint(f"block amax {amax!r}: torchao RCEIL code {got}; exact code {expected} (allowance: exact)")\nsys.exit(1 if got != expected else 0)\n'

TORCHAO_NVFP4_ZERO_TENSOR_NAN = 'import sys\n\nimport torch\nfrom torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale\n\n# NVFP4 with a per-tensor scale (amax / (448 x 6), as per_tensor_amax_to_scale computes it): a tensor\n# of zeros, such as the gradient of an unused path, must dequantise to zeros. Reference: the input\n# itself (zeros are exact in every format); allowance: none.\nx = torch.zeros(2, 32)\nper_tensor_scale = per_tensor_amax_to_scale(x.abs().max())\nq = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_scale)\nback = q.dequantize(torch.float32)\nwrong = int((back != x).sum())  # NaN != 0 counts\nprint(\n    f"zeros through NVFP4 (per-tensor scale {float(per_tensor_scale)!r}): {wrong} of {x.numel()} values "\n    f"differ, e.g. {back.flatten()[0].item()!r} (allowed 0)"\n)\nsys.exit(1 if wrong else 0)\n'

TORCHAO_MX_SMALLEST_SCALE_DIVISOR = "import sys\n\nimport torch\nfrom torchao.prototype.mx_formats import config, mx_tensor\n\n# MX (OCP Microscaling): a block's e8m0 scale is 2^(code - 127) and its elements are the block's\n# values divided by that scale. A block whose only nonzero value is 2^-119 = 256 x 2^-127 gets scale\n# code 0 (2^-127) in FLOOR and RCEIL alike, so its e4m3 element must be 256 and decode to 2^-119.\n# Reference: the input (2^-119 is exact in float32, in e4m3 x e8m0 and in float64); allowance: none.\nBLOCK = 32\nvalue = 2.0**-119\nx = torch.tensor([value] + [0.0] * (BLOCK - 1), dtype=torch.float32)\nwrong = 0\nfor mode in (config.ScaleCalculationMode.FLOOR, config.ScaleCalculationMode.RCEIL):\n    codes, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=mode)\n    code = int(codes.view(torch.uint8).flatten()[0])\n    element = float(data.to(torch.float32).flatten()[0])\n    decoded = element * 2.0 ** (code - 127)\n    print(f\"{mode.value}: scale code {code}, element {element!r}, decodes to {decoded!r}; expected {value!r}\")\n    wrong += decoded != value\nsys.exit(1 if wrong else 0)\n"

TORCHAO_NVFP4_TINY_TENSOR_RECIPROCAL_OVERFLOW = 'import sys\n\nimport torch\nfrom torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale\n\n# NVFP4 with a per-tensor scale (amax / (448 x 6)): a tensor whose largest value is 2^-119 (an\n# underflowing gradient) beside zeros. Its per-tensor scale 2^-119 / 2688 is a float32 subnormal;\n# dequantised, the zeros must stay zeros and 2^-121 (1.5 in e2m1 units of its block) must come back\n# closer to itself than to e2m1\'s neighbours 1 and 2. Reference: the input.\nx = torch.zeros(1, 32)\nx[0, 0] = 2.0**-119\nx[0, 1] = 2.0**-121\nper_tensor_scale = per_tensor_amax_to_scale(x.abs().max())\nq = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_scale)\nback = q.dequantize(torch.float32)\nzeros_wrong = int((back[0, 2:] != 0).sum())\nratio = back[0, 1].item() / x[0, 1].item()\nprint(\n    f"per-tensor scale {float(per_tensor_scale)!r}: {zeros_wrong} of 30 zeros dequantise nonzero "\n    f"(e.g. {back[0, 2].item()!r}, allowed 0); 2^-121 comes back x{ratio!r} (allowed 5/6 to 7/6: "\n    "half the way to e2m1\'s neighbours of 1.5)"\n)\nsys.exit(1 if zeros_wrong or not 5 / 6 <= ratio <= 7 / 6 else 0)\n'

#: The reproduction of every registered known issue, by id.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            "update-int-new-scale",
            ("torch",),
            UPDATE_INT_NEW_SCALE,
            ("scaler.update(1024)", "scaler.update(1024.0)"),
            compiles=False,
        ),
        Reproduction(
            "update-before-scale-after-load",
            ("torch",),
            UPDATE_BEFORE_SCALE_AFTER_LOAD,
            (
                "restored.load_state_dict(saved.state_dict())\n",
                'restored.load_state_dict(saved.state_dict())\nrestored._lazy_init_scale_growth_tracker(torch.device("cpu"))\n',
            ),
            compiles=False,
        ),
        Reproduction(
            "sharded-cpu-growth-uncapped",
            ("torch",),
            SHARDED_CPU_GROWTH_UNCAPPED,
            ('scaler = ShardedGradScaler("cpu",', 'scaler = torch.amp.GradScaler("cpu",'),
            compiles=False,
        ),
        Reproduction(
            "fused-sgd-first-step-overflow-keeps-uninitialised-momentum",
            ("torch",),
            FUSED_SGD_FIRST_STEP_OVERFLOW_KEEPS_UNINITIALISED_MOMENTUM,
            ("momentum=0.9, fused=True)", "momentum=0.9, fused=False)"),
            compiles=False,
        ),
        Reproduction(
            "compiled-backward-under-forward-autocast",
            ("torch",),
            COMPILED_BACKWARD_UNDER_FORWARD_AUTOCAST,
            (
                "torch.manual_seed(0)\n",
                'import torch._functorch.config\n\ntorch._functorch.config.backward_pass_autocast = "off"\ntorch.manual_seed(0)\n',
            ),
            compiles=True,
        ),
        Reproduction(
            "inductor-elides-eager-roundings",
            ("torch",),
            INDUCTOR_ELIDES_EAGER_ROUNDINGS,
            (
                "torch.manual_seed(0)\n",
                "import torch._inductor.config\n\ntorch._inductor.config.emulate_precision_casts = True\ntorch.manual_seed(0)\n",
            ),
            compiles=True,
        ),
        Reproduction(
            "torchao-pow2-scale-rounds-up",
            ("torch", "torchao"),
            TORCHAO_POW2_SCALE_ROUNDS_UP,
            (
                "got = float(float8_utils.amax_to_scale(torch.tensor(amax), torch.float8_e4m3fn, round_scales_to_power_of_2=True))",
                "got = 2.0 ** (math.frexp(FP8_MAX / amax)[1] - 1)",
            ),
            compiles=False,
        ),
        Reproduction(
            "torchao-rceil-scale-near-power-of-2",
            ("torch", "torchao", "numpy"),
            TORCHAO_RCEIL_SCALE_NEAR_POWER_OF_2,
            ("got = int(codes.view(torch.uint8).flatten()[0])", "got = 127 + math.ceil(math.log2(amax / ELEM_MAX))"),
            compiles=False,
        ),
        Reproduction(
            "torchao-nvfp4-zero-tensor-nan",
            ("torch", "torchao"),
            TORCHAO_NVFP4_ZERO_TENSOR_NAN,
            (
                "per_tensor_scale = per_tensor_amax_to_scale(x.abs().max())",
                "per_tensor_scale = torch.where(x.abs().max() == 0, 1.0, per_tensor_amax_to_scale(x.abs().max()))",
            ),
            compiles=False,
        ),
        Reproduction(
            "torchao-mx-smallest-scale-divisor",
            ("torch", "torchao"),
            TORCHAO_MX_SMALLEST_SCALE_DIVISOR,
            # the fix: elements divided by the power of two the stored code names
            (
                "    codes, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=mode)\n",
                "    codes, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=mode)\n"
                "    data = (x / 2.0 ** (int(codes.view(torch.uint8).flatten()[0]) - 127)).to(torch.float8_e4m3fn)\n",
            ),
            compiles=False,
        ),
        Reproduction(
            "torchao-nvfp4-tiny-tensor-reciprocal-overflow",
            ("torch", "torchao"),
            TORCHAO_NVFP4_TINY_TENSOR_RECIPROCAL_OVERFLOW,
            # the fix: elements divided by the combined scale instead of multiplied by an overflowed reciprocal
            (
                "back = q.dequantize(torch.float32)\n",
                "back = q.dequantize(torch.float32)\n"
                "back = (q.scale.to(torch.float32) * per_tensor_scale).repeat_interleave(16, -1)\n"
                "back = back * torch.where(back > 0, x / back, 0.0).clamp(-6, 6).mul(2).round().div(2)\n",
            ),
            compiles=False,
        ),
    )
}


def script(issue_id: str, provenance: str, body: str | None = None) -> str:
    """The standalone script of ``issue_id``: a header naming the issue, its registry entry and
    ``provenance`` (versions, hardware, date: where the script was written), then its body."""
    try:
        repro = REPRODUCTIONS[issue_id]
    except KeyError:
        raise KeyError(f"no reproduction for {issue_id!r}; known issues: {', '.join(sorted(REPRODUCTIONS))}") from None
    where, issue = REGISTRIES[issue_id]
    wrap = textwrap.TextWrapper(
        width=98, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False, break_long_words=False
    )
    header = [
        f"# Reproduces {issue.id} ({issue.package} {', '.join(issue.affected)}, {', '.join(issue.devices)}).",
        *wrap.wrap(issue.summary),
        *wrap.wrap(f"Where: {issue.reference}. Registered in amp-harness {where}."),
        *wrap.wrap(f"Written on: {provenance}."),
        f"# Needs only {' and '.join(repro.needs)}. Run: python {issue_id.replace('-', '_')}.py",
        "# Exit status: 1 while the defect is present, 0 once it is fixed, 2 if it could not run.",
        "",
    ]
    return "\n".join(header) + COULD_NOT_RUN + (repro.body if body is None else body)


#: Every script starts with this: an error the script did not expect (a missing package, an API
#: that moved) exits 2, never 1, so that it cannot read as "the defect is present".
COULD_NOT_RUN = """import sys as _sys


def _could_not_run(kind, value, traceback):  # an unexpected error is not the defect: exit 2
    _sys.__excepthook__(kind, value, traceback)
    print("could not run the reproduction (exit 2): the error above is not the defect", file=_sys.stderr)
    _sys.stderr.flush()
    __import__("os")._exit(2)


_sys.excepthook = _could_not_run

"""
