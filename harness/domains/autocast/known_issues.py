"""Autocast behaviour of torch releases, each registered as an upstream lifecycle (first release,
fix, last verified; :class:`~harness.domains.versions.KnownIssue`) and observed by the autocast
suite on every run (``suites/autocast/test_module_fast_paths.py``), so that a release that changes
it is noticed."""

from __future__ import annotations

from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

ENCODER_FAST_PATH = "cpu-autocast-encoder-fast-path-mixed-dtypes"
GRAD_FREE_CASTS = "autocast-cache-keeps-grad-free-casts"
VMAP_BIAS = "autocast-vmap-bias-in-fp32"

#: ``first`` and ``fixed`` as running the issue's script on every minor release from 2.4 to 2.15
#: found them (docs/releases/record.md): present on 2.4 and 2.5, absent from 2.6 on.
KNOWN_ISSUES: dict[str, KnownIssue] = {
    ENCODER_FAST_PATH: KnownIssue(
        ENCODER_FAST_PATH,
        "nn.TransformerEncoderLayer's inference fast path (eval, no autograd) under CPU autocast raises 'mat1 and "
        "mat2 must have the same dtype': autocast casts the fused attention to low precision but not "
        "_addmm_activation, so the fused feed-forward meets a low-precision activation and fp32 weights",
        first="2.4",
        fixed="2.6",
        verified="2.5",
        reference="pytorch/pytorch#132613, fixed by #135936 (_addmm_activation in AutocastCPU's lower-precision list)",
        devices=("cpu",),
    ),
    GRAD_FREE_CASTS: KnownIssue(
        GRAD_FREE_CASTS,
        "a module evaluated under torch.no_grad (or inference_mode) and then trained in one autocast region: the "
        "training pass reuses the weight casts autocast cached without autograd history, so the weights before a "
        "LayerNorm silently get no gradient (without one, backward raises)",
        first="2.4",
        fixed="2.11",
        verified="2.10",
        reference="pytorch/pytorch#142234 and #158232 (the no_grad case of #112583 came back), fixed by #165068",
        # autocast's cache is device-independent code (aten/src/ATen/autocast_mode.cpp); the upstream
        # reports are CUDA runs, the lifecycle was run on the CPU
        devices=("cpu", "cuda"),
    ),
    VMAP_BIAS: KnownIssue(
        VMAP_BIAS,
        "a Linear or convolution with a bias under torch.vmap and autocast returns fp32 where the unbatched call "
        "returns the autocast dtype: the batching rule splits the op into a matmul (low precision) and a bias add "
        "that runs in fp32 below autocast's dispatch",
        first="2.4",
        verified="2.15",
        reference="pytorch/pytorch#192617 (open)",
        devices=("cpu",),
    ),
}

#: Where the registry lives, for the messages that ask to edit it.
WHERE = "KNOWN_ISSUES in harness/domains/autocast/known_issues.py"

#: The standalone script of each known issue above (``issue_scripts/``), and the edit standing for its fix.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            ENCODER_FAST_PATH,
            "harness.domains.autocast",
            ("torch",),
            # the fix casts the fused feed-forward's operands alike: the layer's weights already in
            # the autocast dtype stand for it (the fast path then meets one dtype)
            (
                '        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype):\n            out = layer(x)\n',
                '        with torch.inference_mode(), torch.autocast("cpu", dtype=dtype):\n            out = layer.to(dtype)(x.to(dtype))\n',
            ),
        ),
        Reproduction(
            GRAD_FREE_CASTS,
            "harness.domains.autocast",
            ("torch",),
            # the documented way out: no cache, so the training pass casts the weights afresh
            ('torch.autocast("cpu", dtype=dtype)', 'torch.autocast("cpu", dtype=dtype, cache_enabled=False)'),
        ),
        Reproduction(
            VMAP_BIAS,
            "harness.domains.autocast",
            ("torch",),
            # a Linear without a bias: nothing for the batching rule to add outside the matmul
            ("linear = torch.nn.Linear(8, 6)", "linear = torch.nn.Linear(8, 6, bias=False)"),
        ),
    )
}
