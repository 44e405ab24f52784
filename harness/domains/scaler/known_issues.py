"""Loss-scaler behaviour of torch releases, each registered as an upstream lifecycle (first
release, fix, last verified; :class:`KnownIssue`) and observed by the scaler suite on every run
(``suites/scaler/test_overflow_in_training.py``, the state machine and the optimizer checks), so
that a release that changes it is noticed; with each its standalone reproduction
(``issue_scripts/``)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.domains import versions
from harness.domains.repro import Reproduction


@dataclass(frozen=True)
class KnownIssue(versions.KnownIssue):
    #: the scaler classes it concerns (a subclass counts as its torch base class)
    scalers: tuple[str, ...] = ("GradScaler", "ShardedGradScaler")

    def applies(self, torch_version: str, scaler: type, device_type: str) -> bool:
        """Whether the registry says this issue is present for that release, scaler and device."""
        return self.listed(torch_version, device_type) and scaler_kind(scaler) in self.scalers


#: torch's scaler classes, most derived first: what a (possibly broken) subclass is judged as.
SCALER_KINDS = ("ShardedGradScaler", "GradScaler")


def scaler_kind(cls: type) -> str:
    """The torch scaler class ``cls`` is or derives from (by name: this module imports no torch)."""
    for base in cls.__mro__:
        if base.__name__ in SCALER_KINDS:
            return base.__name__
    return cls.__name__


#: observed by the clipping suite's own registry check (``suites/scaler/test_clipping.py``), not
#: through a scaler: pure fp16 training clips without one
CLIP_FP16_OVERFLOW = "clip-grad-norm-fp16-norm-overflows"

#: ``first`` is the first release each issue was observed in by running its script: the floor of
#: the declared range, 2.4, for every one of these (docs/releases/record.md lists the releases run).
KNOWN_ISSUES: dict[str, KnownIssue] = {
    "update-int-new-scale": KnownIssue(
        "update-int-new-scale",
        "GradScaler.update(new_scale) accepts a float or a tensor; a Python int falls into the tensor branch and "
        "raises AttributeError ('int' object has no attribute 'device')",
        first="2.4",
        verified="2.15",
        reference="torch/amp/grad_scaler.py: update(): isinstance(new_scale, float) else tensor checks",
    ),
    "update-before-scale-after-load": KnownIssue(
        "update-before-scale-after-load",
        "a GradScaler restored with load_state_dict() creates its scale tensor lazily at the next scale(); "
        "update(new_scale) before that raises AssertionError ('_scale is None')",
        first="2.4",
        verified="2.15",
        reference="torch/amp/grad_scaler.py: _check_scale_growth_tracker() in update()",
    ),
    "sharded-cpu-growth-uncapped": KnownIssue(
        "sharded-cpu-growth-uncapped",
        "ShardedGradScaler's CPU update (_amp_update_scale_cpu_) multiplies the scale by the growth factor without "
        "the float32 cap GradScaler applies: the scale becomes inf and stays there (inf x backoff = inf), so every "
        "later step is skipped",
        first="2.4",
        verified="2.15",
        reference="torch/distributed/fsdp/sharded_grad_scaler.py: _amp_update_scale_cpu_ (vs torch._amp_update_scale_)",
        scalers=("ShardedGradScaler",),
        devices=("cpu",),
    ),
    "fused-sgd-first-step-overflow-keeps-uninitialised-momentum": KnownIssue(
        "fused-sgd-first-step-overflow-keeps-uninitialised-momentum",
        "SGD(momentum, fused=True) allocates its momentum buffers with empty_like before its first step; when "
        "GradScaler skips that step for an overflow (found_inf), the kernel returns without writing them, and the "
        "next step reads the uninitialised memory as momentum: parameters jumped by 2.6e14 in one step",
        first="2.4",
        verified="2.15",
        reference="torch/optim/sgd.py: _fused_sgd() (is_first_step, empty_like) and _fused_sgd_'s found_inf early return",
        # seen on CUDA in the first GPU qualification (torch 2.11, H200); no later release has run on a GPU yet
        device_lifecycles=(("cuda", "2.11", None, "2.11"),),
    ),
    "fused-sgd-cpu-skips-low-precision-vector-blocks": KnownIssue(
        "fused-sgd-cpu-skips-low-precision-vector-blocks",
        "SGD(fused=True) on the CPU leaves every whole SIMD block of a bfloat16 or float16 parameter unchanged (only "
        "the remainder steps; with momentum the buffer takes garbage too): pure low-precision training with fused SGD "
        "does not train, silently",
        first="2.4",
        fixed="2.14",
        verified="2.13",
        reference="pytorch/pytorch#191763, fixed by pytorch/pytorch#192545 (aten/src/ATen/native/cpu/FusedSGDKernel.cpp)",
        devices=("cpu",),
    ),
    CLIP_FP16_OVERFLOW: KnownIssue(
        CLIP_FP16_OVERFLOW,
        "clip_grad_norm_ of float16 gradients (pure fp16 training, where GradScaler refuses fp16 gradients) whose "
        "total norm exceeds 65504, every element finite: the per-tensor norms come back in float16 as inf, the "
        "coefficient max_norm / inf is 0 and the gradients are silently zeroed (for-loop and foreach alike)",
        first="2.4",
        verified="2.15",
        reference="torch/nn/utils/clip_grad.py (per-tensor norms in the gradients' dtype); no upstream report "
        "found: found by the harness's low-precision clipping check",
    ),
}


#: The standalone script of each known issue above (``issue_scripts/``), and the edit standing for its fix.
REPRODUCTIONS: dict[str, Reproduction] = {
    r.issue: r
    for r in (
        Reproduction(
            "update-int-new-scale",
            "harness.domains.scaler",
            ("torch",),
            ("scaler.update(1024)", "scaler.update(1024.0)"),
        ),
        Reproduction(
            "update-before-scale-after-load",
            "harness.domains.scaler",
            ("torch",),
            (
                "restored.load_state_dict(saved.state_dict())\n",
                'restored.load_state_dict(saved.state_dict())\nrestored._lazy_init_scale_growth_tracker(torch.device("cpu"))\n',
            ),
        ),
        Reproduction(
            "sharded-cpu-growth-uncapped",
            "harness.domains.scaler",
            ("torch",),
            ('scaler = ShardedGradScaler("cpu",', 'scaler = torch.amp.GradScaler("cpu",'),
        ),
        Reproduction(
            "fused-sgd-first-step-overflow-keeps-uninitialised-momentum",
            "harness.domains.scaler",
            ("torch",),
            ("momentum=0.9, fused=True)", "momentum=0.9, fused=False)"),
        ),
        Reproduction(
            "fused-sgd-cpu-skips-low-precision-vector-blocks",
            "harness.domains.scaler",
            ("torch",),
            ("lr=0.1, fused=True)", "lr=0.1, fused=False)"),
        ),
        Reproduction(
            CLIP_FP16_OVERFLOW,
            "harness.domains.scaler",
            ("torch",),
            # the fix: the norms accumulated and returned in fp32, the coefficient applied in the gradients' dtype
            (
                "    return torch.nn.utils.clip_grad_norm_(params, max_norm=1.0, foreach=foreach)\n",
                "    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in params]))\n"
                "    for p in params:\n"
                "        p.grad.mul_((1.0 / (total + 1e-6)).clamp(max=1.0).to(p.grad.dtype))\n"
                "    return total\n",
            ),
        ),
    )
}
