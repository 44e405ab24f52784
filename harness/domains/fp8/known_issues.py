"""fp8 scaling behaviour of torchao releases that differs from the exact specification, registered
by torchao minor release and observed on every run (``suites/fp8/test_fp8_scaling.py``): a release
that changes it fails until the registry is updated. Both are harmless in effect (the element that
would need the exact scale rounds to fp8_max either way) but break an exactness claim a user's own
reimplementation would be held to."""

from __future__ import annotations

from harness.domains.versions import KnownIssue

KNOWN_ISSUES: dict[str, KnownIssue] = {
    "torchao-pow2-scale-rounds-up": KnownIssue(
        "torchao-pow2-scale-rounds-up",
        "round_scales_to_power_of_2 computes exp2(floor(log2(scale))) in float32: for a scale within float32 log2's "
        "rounding of a power of two below it (e.g. 32 (1 - 2^-24)), log2 rounds up to the integer and the scale "
        "becomes that power of two, one binade above the exact floor; amax x scale then exceeds fp8_max by at most "
        "that window and rounds to fp8_max",
        affected=("0.17", "0.18"),
        reference="torchao/float8/float8_utils.py _round_scale_down_to_power_of_2",
        package="torchao",
    ),
    "torchao-rceil-scale-near-power-of-2": KnownIssue(
        "torchao-rceil-scale-near-power-of-2",
        "MX RCEIL scales compute ceil(log2(amax / elem_max)) in float32 (CPU, eager): when amax / elem_max lies "
        "just above a power of two, the division or log2 rounds onto it and the e8m0 scale is one code below the "
        "exact ceiling; the block's largest element then saturates at elem_max (by at most float32's rounding)",
        affected=("0.17", "0.18"),
        reference="torchao/prototype/mx_formats/mx_tensor.py _to_mx_rceil (fallback path)",
        package="torchao",
    ),
}

#: Where the registry lives, for the messages that ask to edit it.
WHERE = "KNOWN_ISSUES in harness/domains/fp8/known_issues.py"
