"""Autocast behaviour of torch releases, each registered as an upstream lifecycle (first release,
fix, last verified; :class:`~harness.domains.versions.KnownIssue`) and observed by the autocast
suite on every run (``suites/autocast/test_module_fast_paths.py``, ``test_cast_cache.py``,
``test_vmap_policy.py``, ``test_attention_nonfinite.py``, ``test_nested_regions.py``,
``test_in_place_updates.py``, ``test_attention_masks.py``), so that a release that changes it is
noticed."""

from __future__ import annotations

from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

ENCODER_FAST_PATH = "cpu-autocast-encoder-fast-path-mixed-dtypes"
GRAD_FREE_CASTS = "autocast-cache-keeps-grad-free-casts"
VMAP_BIAS = "autocast-vmap-bias-in-fp32"
SDPA_NAN = "sdpa-cpu-nan-gives-finite-output"
SDPA_INF = "sdpa-cpu-low-precision-inf-gives-finite-output"
NESTED_DTYPE = "autocast-nested-dtype-reuses-outer-casts"
STALE_CASTS = "autocast-cache-ignores-in-place-updates"
MASKED_BLOCKS = "sdpa-cpu-masked-key-blocks-give-nan"

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
    SDPA_NAN: KnownIssue(
        SDPA_NAN,
        "a NaN in one element of a query (or, on 2.5, a key) reaching CPU scaled_dot_product_attention (under "
        "autocast as in fp32): the rows it reaches come out finite (zeros) where the arithmetic gives NaN, hiding it "
        "from the loss; at every length on 2.5, for a query at a short sequence (5) from 2.6",
        first="2.5",
        verified="2.15",
        reference="pytorch/pytorch#141128 (NaN to zeros on the CPU in 2.5; its fix left the short path hiding it)",
        devices=("cpu",),
    ),
    SDPA_INF: KnownIssue(
        SDPA_INF,
        "an inf in one element of a query or a key reaching CPU scaled_dot_product_attention under bf16 or fp16 "
        "autocast at sequence lengths 16 and 64: the rows it overflows come out finite "
        "(zeros) where fp32 and the arithmetic give NaN, hiding the overflow from the loss",
        first="2.9",
        verified="2.15",
        reference="CPU flash attention's low-precision kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp); of "
        "the class of pytorch/pytorch#141128 and #130014; no report of this case found",
        devices=("cpu",),
    ),
    NESTED_DTYPE: KnownIssue(
        NESTED_DTYPE,
        "a region of another low-precision dtype nested in an autocast region (float16 inside bfloat16, or the "
        "reverse) gets the parameter casts the outer region cached, in the outer dtype: the cache is keyed by the "
        "tensor, not by the dtype, so a layer's matmul raises on mixed dtypes and a product of two parameters "
        "silently runs in the outer dtype",
        first="2.4",
        verified="2.15",
        reference="aten/src/ATen/autocast_mode.cpp (cached_casts keyed by the TensorImpl alone); no report of this "
        "case found",
        # the cache is device-independent code; the lifecycle was run on the CPU
        devices=("cpu", "cuda"),
    ),
    STALE_CASTS: KnownIssue(
        STALE_CASTS,
        "a forward after an in-place update of its parameters in the same autocast region (optimizer.step() or "
        "param.data.copy_ between two forwards, as RL, distillation and EMA loops do) computes with the casts "
        "cached before the update: the weights before the step, training silently frozen",
        first="2.4",
        verified="2.15",
        reference="aten/src/ATen/autocast_mode.cpp (cached_casts checks no version counter); met in a trainer: "
        "X-GenGroup/Flow-Factory#186 (frozen fp32-master training, 2026); no torch report found",
        # the cache is device-independent code; the lifecycle was run on the CPU
        devices=("cpu", "cuda"),
    ),
    MASKED_BLOCKS: KnownIssue(
        MASKED_BLOCKS,
        "CPU scaled_dot_product_attention with an additive mask over a long sequence (a sliding window): where a "
        "block of queries has a whole block of keys masked, the flash kernel computes exp(-inf - (-inf)) and makes "
        "NaN rows that the arithmetic keeps finite, in fp32 and under autocast",
        first="2.4",
        fixed="2.4.1",
        verified="2.4",
        reference="pytorch/pytorch#127055, fixed by #130014 (in 2.5, and in 2.4.1 by its cherry-pick)",
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
        Reproduction(
            SDPA_NAN,
            "harness.domains.autocast",
            ("torch",),
            # the math backend propagates the NaN as the arithmetic does: a kernel that does the same
            (
                "    return F.scaled_dot_product_attention(q, k, v)",
                "    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0]",
            ),
        ),
        Reproduction(
            NESTED_DTYPE,
            "harness.domains.autocast",
            ("torch",),
            # the documented way out: no cache in the outer region, so the nested one casts afresh
            (
                'with torch.autocast("cpu", dtype=outer):',
                'with torch.autocast("cpu", dtype=outer, cache_enabled=False):',
            ),
        ),
        Reproduction(
            STALE_CASTS,
            "harness.domains.autocast",
            ("torch",),
            # what a fix does: the casts cached before the update are dropped before the next forward
            (
                "            after = layer(x)\n",
                "            torch.clear_autocast_cache()\n            after = layer(x)\n",
            ),
        ),
        Reproduction(
            MASKED_BLOCKS,
            "harness.domains.autocast",
            ("torch",),
            # the math backend computes the masked softmax as the arithmetic does: a kernel that does the same
            (
                "    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)",
                "    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, attn_mask=mask)[0]",
            ),
        ),
        Reproduction(
            SDPA_INF,
            "harness.domains.autocast",
            ("torch",),
            (
                "    return F.scaled_dot_product_attention(q, k, v)",
                "    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0]",
            ),
        ),
    )
}
