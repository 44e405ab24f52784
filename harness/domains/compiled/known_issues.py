"""Compiled-AMP behaviour of torch releases, each registered as an upstream lifecycle (first
release, fix, last verified; :class:`~harness.domains.versions.KnownIssue`) and observed by the
compiled suite on every run (``suites/compiled/test_compiled_known_issues.py``), so that a release
that changes it is noticed."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from harness.domains.compiled import scalars
from harness.domains.engines.compiler.compiling import AUTOGRAD_CACHE_DTYPE as AUTOGRAD_CACHE_DTYPE
from harness.domains.engines.compiler.compiling import AUTOGRAD_CACHE_IGNORES_DTYPE
from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

#: Inductor's generated C++ that does not build on torch 2.5 (the compiled block's bf16 backward)
BUILD_FAILURE = "inductor-cpu-vectorizedn-fmadd-build-failure"
#: Inductor's CPU outer-loop fusion reading a buffer it localised (torch 2.6: losses sharing logits)
REMOVED_BUFFER = "inductor-cpu-outer-loop-fusion-removed-buffer"
#: torch.export of a module with autocast regions (``suites/compiled/test_exported_autocast.py``)
EXPORT_NONSTRICT_DROPS = "export-nonstrict-drops-autocast-regions"
EXPORT_STRICT_NESTED = "export-strict-nested-autocast-regions"
#: the export mode each export issue shows in
EXPORT_ISSUES = {"non_strict": EXPORT_NONSTRICT_DROPS, "strict": EXPORT_STRICT_NESTED}

#: ``first`` and ``fixed`` as running each issue's script on every minor release from 2.4 to 2.15
#: on the CPU found them (docs/releases/record.md); inductor-elides-eager-roundings differs by CPU
#: kind: its lifecycle on AMD Zen 4 is registered by hardware class.
KNOWN_ISSUES: dict[str, KnownIssue] = {
    "compiled-backward-under-forward-autocast": KnownIssue(
        "compiled-backward-under-forward-autocast",
        "AOTAutograd traces a compiled region's backward under the autocast state of its forward "
        "(torch._functorch.config.backward_pass_autocast = 'same_as_forward'), so a region with autocast disabled "
        "inside an autocast forward gets a low-precision backward: its fp32 weight gradients differ from eager's "
        "(backward called outside autocast) far beyond fp32 rounding. Remedy: backward_pass_autocast = 'off'",
        first="2.4",
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
        # on the CPU kind it was registered on absent in 2.11, fixed in 2.14; on AMD Zen 4 (every kernel
        # set) present in every release from 2.4 to 2.15 (its script, and the compiled suite's check on
        # 2.13, 2.14 and 2.15); on CUDA present in 2.11 (the first GPU qualification, H200), and no
        # later release has run on a GPU yet
        device_lifecycles=(("cuda", "2.11", None, "2.11"), ("cpu-amd-zen4", "2.4", None, "2.15")),
    ),
    "inductor-fp8-cast-saturates": KnownIssue(
        "inductor-fp8-cast-saturates",
        "Inductor's generated cast to float8 on CUDA (Triton's conversion) saturates: values beyond the format's "
        "largest finite value, inf included, become +-448 (e4m3fn) or +-57344 (e5m2), where eager's cast gives NaN "
        "(e4m3fn) or inf (e5m2); the same tensor cast in a compiled and an eager region disagrees exactly at overflow, "
        "where a delayed-scaling recipe's amax history would have told the overflow apart",
        first="2.11",
        verified="2.11",
        reference="pytorch/ao#1912 (eager unsaturated, Triton saturated); pytorch/pytorch#178817 (eager e4m3 casts)",
        devices=("cuda",),
    ),
    AUTOGRAD_CACHE_DTYPE: AUTOGRAD_CACHE_IGNORES_DTYPE,
    BUILD_FAILURE: KnownIssue(
        BUILD_FAILURE,
        "Inductor's CPU code for the backward of logits that feed both a softmax and a cross-entropy loss under bf16 "
        "autocast calls fmadd on VectorizedN<float, 2> operands, an overload ATen does not have: the C++ does not "
        "build (CppCompileError), so the compiled AMP step cannot run at all",
        first="2.5",
        fixed="2.6",
        verified="2.5",
        reference="Inductor CPU vectorization of VectorizedN (torch 2.5.1); of the class of pytorch/pytorch#143568",
        devices=("cpu",),
    ),
    REMOVED_BUFFER: KnownIssue(
        REMOVED_BUFFER,
        "Inductor's CPU outer-loop fusion localises a buffer, fails to merge the loops, and falls back to plain "
        "code that still reads the removed global buffer: a softmax and a log-softmax of the same logits, "
        "differentiated (a distillation or an entropy term beside the cross-entropy), stop the compile with "
        "'AssertionError: buf0', in fp32 and under bf16/fp16 autocast alike, so the compiled step cannot run",
        first="2.6",
        fixed="2.7",
        verified="2.6",
        reference="pytorch/pytorch#144186 (sum-softmax, the same assertion); fixed by #144243 (restore removed "
        "buffers before the fallback), after 2.6's branch cut",
        devices=("cpu",),
    ),
    EXPORT_NONSTRICT_DROPS: KnownIssue(
        EXPORT_NONSTRICT_DROPS,
        "torch.export with strict=False leaves a module's autocast regions out of the exported program: it runs "
        "them in fp32 where eager runs them in the autocast dtype, silently (the deployed model has no AMP)",
        first="2.4",
        fixed="2.6",
        verified="2.5",
        reference="pytorch/pytorch#137495 (autocast nodes missing from non-strict export graphs), fixed there",
    ),
    EXPORT_STRICT_NESTED: KnownIssue(
        EXPORT_STRICT_NESTED,
        "torch.export with strict=True of a region with autocast disabled inside an autocast region (a norm or "
        "rotary embedding recomputed in fp32, as Hugging Face's models do) never gives eager's outputs: the export "
        "raises (2.5), the program runs the regions in fp32 silently (2.6, 2.7), the program stops at run time on "
        "its own dtype assertion, having recorded the low-precision tensor entering the region as fp32 (2.8 on)",
        first="2.5",
        verified="2.15",
        reference="autocast regions in export (pytorch/pytorch#132677); the dtype assertions export inserts "
        "(pytorch/pytorch#151001, _insert_aten_to_metadata_assert_pass); no upstream report of this case found",
    ),
    scalars.COMPARISON: KnownIssue(
        scalars.COMPARISON,
        "Inductor compares a bf16/fp16 tensor with a Python scalar kept unrounded in fp32, where eager rounds the "
        "scalar to the tensor's dtype first: at the rounded scalar, h > S and h == S give the opposite answers "
        "(a threshold on an autocast output lets other elements through compiled)",
        first="2.4",
        fixed="2.12",
        verified="2.11",
        reference="pytorch/pytorch#128306 (CPU AMP threshold), #173987; fixed by #175807 (comparison scalars rounded)",
    ),
    scalars.ADD_SUB: KnownIssue(
        scalars.ADD_SUB,
        "Inductor adds or subtracts a Python scalar to a bf16/fp16 tensor on the CPU with the scalar unrounded in "
        "fp32, where CPU eager rounds it to the tensor's dtype: at the boundary, clamp_min(h + S, 0) and "
        "margin_ranking_loss(margin=S) drop their gradient (silently zero) and relu(h - S) lets an element through",
        first="2.4",
        fixed="2.14",
        verified="2.13",
        reference="pytorch/pytorch#185517; fixed by #185869 / #186818 (add/sub scalars rounded on the CPU)",
        devices=("cpu",),
    ),
    scalars.FMOD_REMAINDER: KnownIssue(
        scalars.FMOD_REMAINDER,
        "Inductor takes fmod/remainder of a bf16/fp16 tensor by a Python scalar on the CPU with the scalar unrounded "
        "in fp32, where CPU eager rounds it to the tensor's dtype: fmod(2 round(S), S) is not 0, and remainder's sign "
        "correction makes a residue almost a whole modulus",
        first="2.4",
        verified="2.15",
        reference="pytorch/pytorch#186875, open (#186942 proposed; remainder agrees from 2.14, fmod does not in 2.15)",
        devices=("cpu",),
    ),
}


#: The known issue a compiled fp8 cast shows (:mod:`suites.fp8.test_fp8_formats` observes it).
SATURATING_FP8_CAST = "inductor-fp8-cast-saturates"

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
        Reproduction(
            AUTOGRAD_CACHE_DTYPE,
            "harness.domains.compiled",
            ("torch",),
            ("torch.manual_seed(0)\n", "torch._functorch.config.enable_autograd_cache = False\ntorch.manual_seed(0)\n"),
            compiles=True,
        ),
        Reproduction(
            BUILD_FAILURE,
            "harness.domains.compiled",
            ("torch",),
            ("    torch.autograd.backward(torch.compile(block)(x, y))\n", "    torch.autograd.backward(block(x, y))\n"),
            compiles=True,
        ),
        *(
            # the fix rounds the scalar as CPU eager does: eager stands for it
            Reproduction(
                issue,
                "harness.domains.compiled",
                ("torch",),
                ("torch.compile(program)(x, dtype)", "program(x, dtype)"),
                compiles=True,
            )
            for issue in scalars.ISSUES
        ),
        Reproduction(
            REMOVED_BUFFER,
            "harness.domains.compiled",
            ("torch",),
            ("    torch.autograd.backward(torch.compile(step)(x, y))\n", "    torch.autograd.backward(step(x, y))\n"),
            compiles=True,
        ),
        Reproduction(
            EXPORT_NONSTRICT_DROPS,
            "harness.domains.compiled",
            ("torch",),
            # eager stands for a program that runs the regions as eager does
            ("torch.export.export(m, (x,), strict=False).module()(x)", "m(x)"),
        ),
        Reproduction(
            EXPORT_STRICT_NESTED,
            "harness.domains.compiled",
            ("torch",),
            ("            exported = program.module()(x)\n", "            exported = m(x)\n"),
        ),
        Reproduction(
            SATURATING_FP8_CAST,
            "harness.domains.compiled",
            ("torch",),
            ("compiled = torch.compile(cast)(x)\n", "compiled = cast(x)\n"),
            compiles=True,
        ),
    )
}


def is_build_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is :data:`BUILD_FAILURE`'s: Inductor's C++ not building on ``fmadd`` of
    ``VectorizedN`` operands (a compile failure of another kind is not this issue)."""
    text = str(exc)
    return "C++ compile error" in text and "fmadd" in text and "VectorizedN" in text


def compiler_error(exc: BaseException) -> str | None:
    """The C++ compiler's first ``error:`` line in ``exc`` (Inductor's generated code that did not
    build), or None."""
    return next((line.strip() for line in str(exc).splitlines() if "error:" in line), None)


def is_removed_buffer(exc: BaseException) -> bool:
    """Whether ``exc`` is :data:`REMOVED_BUFFER`'s: Inductor asserting that a buffer it reads was
    not removed (``AssertionError: buf0``); another compile failure is not this issue."""
    return re.search(r"AssertionError: buf\d+\b", f"{type(exc).__name__}: {exc}") is not None


#: Each registered failure to compile at all, and how its error is told apart from another's.
COMPILE_FAILURES: dict[str, Callable[[BaseException], bool]] = {
    BUILD_FAILURE: is_build_failure,
    REMOVED_BUFFER: is_removed_buffer,
}


def known_build_failure(exc: BaseException, device_type: str) -> KnownIssue | None:
    """The entry of the registered compile failure ``exc`` is (:data:`COMPILE_FAILURES`), where
    the registry lists it for this release (the compiled cells then read KNOWN), else None (``exc``
    is a failure of its own)."""
    for issue_id, matches in COMPILE_FAILURES.items():
        issue = KNOWN_ISSUES[issue_id]
        if matches(exc) and issue.listed(torch.__version__, device_type):
            return issue
    return None


def build_failure_seen(compile_block: Callable[[], object]) -> tuple[bool, str]:
    """Run ``compile_block`` (the probe block's bf16 compile): whether it failed with
    :data:`BUILD_FAILURE`, and what was seen. Any other failure is raised."""
    try:
        compile_block()
    except Exception as exc:
        if not is_build_failure(exc):
            raise
        return True, (compiler_error(exc) or "C++ compile error")[:300]
    return False, "the probe block's bf16 compile builds"
