"""fp8 scaling behaviour of torchao releases that differs from the exact specification, each
registered as an upstream lifecycle of torchao releases (first, fix, last verified) and observed on
every run (``suites/fp8/test_fp8_scaling.py``), so that a release that changes it is noticed. The
power-of-two scale rounding is harmless in effect (the element that would need the exact scale
rounds to fp8_max either way) but breaks an exactness claim a user's own reimplementation would be
held to."""

from __future__ import annotations

from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

KNOWN_ISSUES: dict[str, KnownIssue] = {
    "torchao-pow2-scale-rounds-up": KnownIssue(
        "torchao-pow2-scale-rounds-up",
        "round_scales_to_power_of_2 computes exp2(floor(log2(scale))) in float32: for a scale within float32 log2's "
        "rounding of a power of two below it (e.g. 32 (1 - 2^-24)), log2 rounds up to the integer and the scale "
        "becomes that power of two, one binade above the exact floor; amax x scale then exceeds fp8_max by at most "
        "that window and rounds to fp8_max",
        first="0.17",
        verified="0.18",
        reference="torchao/float8/float8_utils.py _round_scale_down_to_power_of_2",
        package="torchao",
    ),
}

#: Where the registry lives, for the messages that ask to edit it.
WHERE = "KNOWN_ISSUES in harness/domains/fp8/known_issues.py"


#: The standalone script of each known issue above (``issue_scripts/``), and the edit standing for its fix.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            "torchao-pow2-scale-rounds-up",
            "harness.domains.fp8",
            ("torch", "torchao"),
            (
                "got = float(float8_utils.amax_to_scale(torch.tensor(amax), torch.float8_e4m3fn, round_scales_to_power_of_2=True))",
                "got = 2.0 ** (math.frexp(FP8_MAX / amax)[1] - 1)",
            ),
        ),
    )
}
