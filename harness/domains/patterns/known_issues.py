"""AMP patterns torch releases break, each registered as an upstream lifecycle (first release, fix,
last verified; :class:`~harness.domains.versions.KnownIssue`) and observed by the patterns suite on
every run (``suites/patterns/test_checkpointing.py``, ``test_custom_functions.py``), so that a
release that changes it is noticed; with each its standalone reproduction (``issue_scripts/``).

``first`` and ``fixed`` as running each script on every minor release from 2.4 to 2.15 found them
(docs/releases/record.md)."""

from __future__ import annotations

from harness.domains.repro import Reproduction
from harness.domains.versions import KnownIssue

FSDP2_POLICY_RECOMPUTE = "fsdp2-checkpoint-recompute-skips-policy-cast"
SETUP_CONTEXT = "custom-fwd-setup-context-loses-autocast-state"
SELECTIVE_SHARED = "selective-checkpoint-shared-weight-cast-cache"
SEQUENTIAL_REPEATS = "checkpoint-sequential-drops-repeated-modules"

KNOWN_ISSUES: dict[str, KnownIssue] = {
    FSDP2_POLICY_RECOMPUTE: KnownIssue(
        FSDP2_POLICY_RECOMPUTE,
        "an FSDP2 unit under a MixedPrecisionPolicy, checkpointed (non-reentrant): its recomputation in backward "
        "skips the unit's pre-forward cast of its inputs, so an fp32 input the forward got cast (a rotary table) "
        "recomputes in fp32 and the checkpoint's metadata check raises",
        first="2.7",
        fixed="2.13",
        verified="2.12",
        reference="pytorch/pytorch#148831 and #159359; the pre-forward hook's early return in PRE_BACKWARD "
        "(torch/distributed/fsdp/_fully_shard/_fsdp_state.py) casts the inputs from 2.13",
        # FSDP2 runs on the CPU from 2.7 (2.4 to 2.6 need CUDA streams): the range was run there
        devices=("cpu",),
    ),
    SETUP_CONTEXT: KnownIssue(
        SETUP_CONTEXT,
        "a custom autograd function with a separate setup_context (the form torch.func and torch.compile ask "
        "for), decorated with torch.amp.custom_fwd and custom_bwd: backward raises AttributeError "
        "('_fwd_used_autocast'), custom_fwd having marked its first input rather than ctx",
        first="2.4",
        verified="2.15",
        reference="pytorch/pytorch#132388 (open)",
        # torch/amp/autocast_mode.py, device-independent Python
        devices=("cpu", "cuda"),
    ),
    SELECTIVE_SHARED: KnownIssue(
        SELECTIVE_SHARED,
        "a layer used in two selectively checkpointed regions of one autocast forward (a shared layer, tied "
        "weights): the second region's forward takes autocast's cached weight cast, its recomputation casts, "
        "and SAC's replay raises 'aten._to_copy.default ... not found in storage'",
        first="2.13",
        verified="2.15",
        reference="pytorch/pytorch#193338 (open)",
        devices=("cpu", "cuda"),
    ),
    SEQUENTIAL_REPEATS: KnownIssue(
        SEQUENTIAL_REPEATS,
        "torch.utils.checkpoint.checkpoint_sequential on an nn.Sequential holding one module twice (a shared "
        "layer) runs it once: it takes the Sequential's children(), which list each module once, so the "
        "checkpointed model silently differs from the model, in fp32 and under autocast alike",
        first="2.4",
        verified="2.15",
        reference="torch/utils/checkpoint.py checkpoint_sequential (functions.children()); no upstream report "
        "found: found by the harness's shared-layer checkpointing check",
        devices=("cpu", "cuda"),
    ),
}

#: Where the registry lives, for the messages that ask to edit it.
WHERE = "KNOWN_ISSUES in harness/domains/patterns/known_issues.py"

#: The standalone script of each known issue above (``issue_scripts/``), and the edit standing for its fix.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            FSDP2_POLICY_RECOMPUTE,
            "harness.domains.patterns",
            ("torch",),
            # the table made in the policy's dtype: the cast the recomputation skips has nothing to do
            ("self.table_dtype = torch.float32", "self.table_dtype = dtype"),
        ),
        Reproduction(
            SETUP_CONTEXT,
            "harness.domains.patterns",
            ("torch",),
            # the fix: the forward's autocast state reaches ctx, where custom_bwd reads it
            (
                "            ctx.save_for_backward(*inputs)\n",
                "            ctx.save_for_backward(*inputs)\n"
                "            ctx._fwd_used_autocast, ctx._dtype = inputs[0]._fwd_used_autocast, inputs[0]._dtype\n",
            ),
        ),
        Reproduction(
            SELECTIVE_SHARED,
            "harness.domains.patterns",
            ("torch",),
            # without autocast's cache every region casts its weights, in the forward and the recomputation
            (
                'with torch.autocast("cpu", dtype=dtype):',
                'with torch.autocast("cpu", dtype=dtype, cache_enabled=False):',
            ),
        ),
        Reproduction(
            SEQUENTIAL_REPEATS,
            "harness.domains.patterns",
            ("torch",),
            # the Sequential's entries as a list: every entry, repeats included, is a function to run
            ("checkpointed = checkpoint_sequential(seq, 2, x", "checkpointed = checkpoint_sequential(list(seq), 2, x"),
        ),
    )
}
