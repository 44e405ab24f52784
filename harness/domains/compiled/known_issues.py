"""Compiled-AMP behaviour of torch releases, each registered as an upstream lifecycle (first
release, fix, last verified; :class:`~harness.domains.versions.KnownIssue`) and observed by the
compiled suite on every run (``suites/compiled/test_compiled_known_issues.py``), so that a release
that changes it is noticed."""

from __future__ import annotations

from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

KNOWN_ISSUES: dict[str, KnownIssue] = {
    "compiled-backward-under-forward-autocast": KnownIssue(
        "compiled-backward-under-forward-autocast",
        "AOTAutograd traces a compiled region's backward under the autocast state of its forward "
        "(torch._functorch.config.backward_pass_autocast = 'same_as_forward'), so a region with autocast disabled "
        "inside an autocast forward gets a low-precision backward: its fp32 weight gradients differ from eager's "
        "(backward called outside autocast) far beyond fp32 rounding. Remedy: backward_pass_autocast = 'off'",
        first="2.13",
        verified="2.15",
        reference="pytorch/pytorch#179804, #153044; default deprecated in #177286, 'off' by default from #177287",
    ),
    "inductor-elides-eager-roundings": KnownIssue(
        "inductor-elides-eager-roundings",
        "Inductor keeps fused low-precision intermediates in fp32 where eager rounds every op's output to the "
        "autocast dtype (torch._inductor.config.emulate_precision_casts = False by default): compiled and eager "
        "AMP outputs differ at fused stages; with emulate_precision_casts = True they agree there",
        first="2.13",
        fixed="2.14",
        reference="pytorch/pytorch#168148, #183761; torch/_inductor/config.py emulate_precision_casts",
    ),
}

#: Where the registry lives, for the messages that ask to edit it.
WHERE = "KNOWN_ISSUES in harness/domains/compiled/known_issues.py"


#: The standalone script of each known issue above (``issue_scripts/``), and the edit standing for its fix.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            "compiled-backward-under-forward-autocast",
            "harness.domains.compiled",
            ("torch",),
            (
                "torch.manual_seed(0)\n",
                'import torch._functorch.config\n\ntorch._functorch.config.backward_pass_autocast = "off"\ntorch.manual_seed(0)\n',
            ),
            compiles=True,
        ),
        Reproduction(
            "inductor-elides-eager-roundings",
            "harness.domains.compiled",
            ("torch",),
            (
                "torch.manual_seed(0)\n",
                "import torch._inductor.config\n\ntorch._inductor.config.emulate_precision_casts = True\ntorch.manual_seed(0)\n",
            ),
            compiles=True,
        ),
    )
}
