"""MX and NVFP4 behaviour of torchao releases that differs from the exact specification, each
registered as an upstream lifecycle of torchao releases (first, fix, last verified) and observed on
every run (``suites/block_scaled/test_block_scale_codes.py``), so that a release that changes it is
noticed. The RCEIL scale rounding is harmless in effect (the block's largest element saturates at
the element's max either way); the NVFP4 zero tensor is not harmless, and blocks at MX's smallest
scale lose a factor of two (floor, ceil) or everything (rceil)."""

from __future__ import annotations

from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

KNOWN_ISSUES: dict[str, KnownIssue] = {
    "torchao-rceil-scale-near-power-of-2": KnownIssue(
        "torchao-rceil-scale-near-power-of-2",
        "MX RCEIL scales compute ceil(log2(amax / elem_max)) in float32 (CPU, eager): when amax / elem_max lies "
        "just above a power of two, the division or log2 rounds onto it and the e8m0 scale is one code below the "
        "exact ceiling; the block's largest element then saturates at elem_max (by at most float32's rounding)",
        first="0.17",
        verified="0.18",
        reference="torchao/prototype/mx_formats/mx_tensor.py _to_mx_rceil (fallback path)",
        package="torchao",
    ),
    "torchao-nvfp4-zero-tensor-nan": KnownIssue(
        "torchao-nvfp4-zero-tensor-nan",
        "NVFP4Tensor.to_nvfp4 with the per-tensor scale per_tensor_amax_to_scale gives (amax / 2688) divides every "
        "block scale by it: for a tensor of zeros that scale is 0, every block scale becomes 0/0 = NaN and the "
        "tensor dequantises to NaN instead of zeros (an all-zero gradient poisons the step; TransformerEngine's "
        "and torchao's own Triton 2D quantiser treat a zero global amax as scale 1)",
        first="0.17",
        verified="0.18",
        reference="torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize (per_tensor_scale branch)",
        devices=("cpu", "cuda"),
        package="torchao",
    ),
    "torchao-mx-smallest-scale-divisor": KnownIssue(
        "torchao-mx-smallest-scale-divisor",
        "An MX block whose e8m0 scale code is 0 (2^-127: a block amax below about 2^-118 for e4m3 elements) is stored with that "
        "code, but its elements are not divided by 2^-127: FLOOR and CEIL clamp the float32 divisor to float32's "
        "smallest normal 2^-126 (a workaround for Triton's subnormals), so the block decodes to half its values; "
        "RCEIL follows TransformerEngine's exponent-0 reciprocal of 1, so the block's elements flush to zero",
        first="0.17",
        verified="0.18",
        reference="torchao/prototype/mx_formats/mx_tensor.py to_mx (F32_MIN_NORMAL clamp) and _to_mx_rceil",
        devices=("cpu", "cuda"),
        package="torchao",
    ),
    "torchao-nvfp4-tiny-tensor-reciprocal-overflow": KnownIssue(
        "torchao-nvfp4-tiny-tensor-reciprocal-overflow",
        "NVFP4Tensor.to_nvfp4 multiplies the elements by (1 / per_tensor_scale) / block_scale in float32: for a "
        "tensor whose amax is below about 2688 x 2^-128 (1e-35, an underflowed gradient) the per-tensor scale is "
        "below 2^-128, its reciprocal overflows to inf, every nonzero element saturates to +-6 and every zero "
        "becomes 0 x inf = NaN, stored as the code of +-1.5: zeros dequantise to nonzero values",
        first="0.17",
        verified="0.18",
        reference="torchao/prototype/mx_formats/nvfp4_tensor.py nvfp4_quantize (reciprocal_scale)",
        devices=("cpu", "cuda"),
        package="torchao",
    ),
}

#: Where the registry lives, for the messages that ask to edit it.
WHERE = "KNOWN_ISSUES in harness/domains/block_scaled/known_issues.py"


#: The standalone script of each known issue above (``issue_scripts/``), and the edit standing for its fix.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            "torchao-rceil-scale-near-power-of-2",
            "harness.domains.block_scaled",
            ("torch", "torchao", "numpy"),
            ("got = int(codes.view(torch.uint8).flatten()[0])", "got = 127 + math.ceil(math.log2(amax / ELEM_MAX))"),
        ),
        Reproduction(
            "torchao-nvfp4-zero-tensor-nan",
            "harness.domains.block_scaled",
            ("torch", "torchao"),
            (
                "per_tensor_scale = per_tensor_amax_to_scale(x.abs().max())",
                "per_tensor_scale = torch.where(x.abs().max() == 0, 1.0, per_tensor_amax_to_scale(x.abs().max()))",
            ),
        ),
        Reproduction(
            "torchao-mx-smallest-scale-divisor",
            "harness.domains.block_scaled",
            ("torch", "torchao"),
            # the fix: elements divided by the power of two the stored code names
            (
                "    codes, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=mode)\n",
                "    codes, data = mx_tensor.to_mx(x, torch.float8_e4m3fn, BLOCK, scaling_mode=mode)\n"
                "    data = (x / 2.0 ** (int(codes.view(torch.uint8).flatten()[0]) - 127)).to(torch.float8_e4m3fn)\n",
            ),
        ),
        Reproduction(
            "torchao-nvfp4-tiny-tensor-reciprocal-overflow",
            "harness.domains.block_scaled",
            ("torch", "torchao"),
            # the fix: elements divided by the combined scale instead of multiplied by an overflowed reciprocal
            (
                "back = q.dequantize(torch.float32)\n",
                "back = q.dequantize(torch.float32)\n"
                "back = (q.scale.to(torch.float32) * per_tensor_scale).repeat_interleave(16, -1)\n"
                "back = back * torch.where(back > 0, x / back, 0.0).clamp(-6, 6).mul(2).round().div(2)\n",
            ),
        ),
    )
}
