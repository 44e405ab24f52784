"""The training patterns' reproductions: each of the six AMP patterns as a script whose model and
data are seeded as the checks build them, so a script needs no saved tensors: gradient
accumulation (``scripts/accumulation.py``), activation checkpointing (``checkpointing.py``), custom
autograd functions (``custom_functions.py``), several optimizers with one scaler
(``optimizers.py``), the gradient penalty (``penalty.py``) and save-and-resume (``resume.py``)."""

from __future__ import annotations

import torch

from harness.domains.patterns import accumulation as A
from harness.domains.patterns import checkpointing as C
from harness.domains.patterns import optimizers as O
from harness.domains.patterns import penalty as P
from harness.domains.patterns import resume as R
from harness.domains.repro import FailureRepro, ScriptTemplate, dtype_src

#: gradient accumulation under GradScaler, standalone: ``scripts/accumulation.py``
ACCUMULATION = ScriptTemplate(__package__ or "harness.domains.patterns", "accumulation")
CHECKPOINTING = ScriptTemplate(__package__ or "harness.domains.patterns", "checkpointing")
CUSTOM_FUNCTIONS = ScriptTemplate(__package__ or "harness.domains.patterns", "custom_functions")
OPTIMIZERS = ScriptTemplate(__package__ or "harness.domains.patterns", "optimizers")
PENALTY = ScriptTemplate(__package__ or "harness.domains.patterns", "penalty")
RESUME = ScriptTemplate(__package__ or "harness.domains.patterns", "resume")
#: the patterns on data-parallel ranks (DDP no_sync, FSDP2 checkpointing): ``scripts/ranks.py``
RANKS = ScriptTemplate(__package__ or "harness.domains.patterns", "ranks")


def accumulation_repro(device: torch.device, dtype: torch.dtype, inf_in: int | None = None) -> FailureRepro:
    """One effective batch of the examples' accumulation loop: without ``inf_in``, the scale held
    and the accumulated gradient against the float64 sum of the micro-batches' own; with it, the
    step skipped and the scale halved once."""
    values = {
        "DEVICE": f"torch.device({device.type!r})",
        "DTYPE": dtype_src(dtype),
        "INF_IN": repr(inf_in),
        "WIDTH": repr(A.WIDTH),
        "MICRO": repr(A.MICRO),
        "MICRO_BATCHES": repr(A.MICRO_BATCHES),
        "SCALE": repr(A.SCALE),
    }
    judgement = "sum" if inf_in is None else "skip"
    code = ACCUMULATION.fill("parameters", "effective_batch", judgement, values=values)
    if inf_in is None:
        what = "gradient accumulation under GradScaler: scale changes and gradient elements over budget"
        allowance = "exact: one scale per effective batch; gamma_(k-1)(2^-24) of the micro-batches' magnitudes"
    else:
        what = f"gradient accumulation under GradScaler with an inf in micro-batch {inf_in}: promises broken"
        allowance = "exact: the step skipped bitwise and the scale halved once"
    return FailureRepro("patterns", what, code, allowance, device=device.type)


def _device(device: torch.device) -> str:
    return f"torch.device({device.type!r})"


def checkpointing_repro(
    device: torch.device, dtype: torch.dtype, variant: str, scale: float, backend: object = None, shared: bool = False
) -> FailureRepro | None:
    """The model with its blocks checkpointed in ``variant`` against the model without
    checkpointing, bit for bit: eager, or both compiled with ``backend`` (a backend of torch's,
    named; None for a backend object, whose code the script would need); ``shared``: the model
    whose first block is also its third."""
    if backend is not None and not isinstance(backend, str):
        return None
    values = {
        "DEVICE": _device(device),
        "DTYPE": dtype_src(dtype),
        "VARIANT": repr(variant),
        "WIDTH": repr(C.WIDTH),
        "BLOCKS": repr(C.BLOCKS),
        "BATCH": repr(C.BATCH),
        "SCALE": repr(scale),
        "BACKEND": repr(backend),
        "SHARED": repr(shared),
    }
    code = CHECKPOINTING.fill("parameters", "model", "gradients", values=values)
    compiled = "" if backend is None else f", compiled by {backend}"
    compiled += ", one layer in two regions" if shared else ""
    what = (
        f"{variant} activation checkpointing under {dtype} autocast{compiled}: gradients unlike the unchecked model's"
    )
    return FailureRepro(
        "patterns", what, code, "exact: the recomputation runs in the forward's precision", device=device.type
    )


def checkpointing_overflow_repro(device: torch.device, variant: str) -> FailureRepro:
    """An inf in a checkpointed block under fp16 autocast and GradScaler: the step skipped and the
    scale halved once."""
    values = {
        "DEVICE": _device(device),
        "VARIANT": repr(variant),
        "WIDTH": repr(C.WIDTH),
        "BLOCKS": repr(C.BLOCKS),
        "BATCH": repr(C.BATCH),
        "SCALE": repr(C.SCALE),
    }
    code = CHECKPOINTING.fill("parameters", "model", "overflow", values=values)
    what = f"{variant} checkpointing with an inf in a recomputed block: promises broken"
    allowance = "exact: the step skipped bitwise and the scale halved once"
    return FailureRepro("patterns", what, code, allowance, device=device.type)


def custom_function_repro(device: torch.device, dtype: torch.dtype, kind: str, style: str = "ctx") -> FailureRepro:
    """The custom linear decorated ``kind``-wise in ``style``, its matmuls' dtypes observed forward
    and backward."""
    values = {"DEVICE": _device(device), "DTYPE": dtype_src(dtype), "KIND": repr(kind), "STYLE": repr(style)}
    code = CUSTOM_FUNCTIONS.fill("parameters", "custom_function", values=values)
    what = f"a custom autograd function ({kind}, {style} form) under {dtype} autocast: matmuls in another dtype"
    return FailureRepro("patterns", what, code, "exact: every matmul in the decorators' dtype", device=device.type)


def optimizers_repro(device: torch.device, overflow_in: int | None) -> FailureRepro:
    """Two models and optimizers with one GradScaler, an inf in model ``overflow_in`` (None: clean)."""
    values = {
        "DEVICE": _device(device),
        "OVERFLOW_IN": repr(overflow_in),
        "WIDTH": repr(O.WIDTH),
        "BATCH": repr(O.BATCH),
        "SCALE": repr(O.SCALE),
    }
    code = OPTIMIZERS.fill("parameters", "two_optimizers", values=values)
    what = f"two optimizers with one GradScaler, overflow in {overflow_in}: promises broken"
    allowance = "exact: each optimizer skips only for its own inf, a taken step bitwise its reference, one backoff"
    return FailureRepro("patterns", what, code, allowance, device=device.type)


def penalty_repro(device: torch.device, dtype: torch.dtype, judgement: str) -> FailureRepro:
    """The gradient-penalty step, judged ``"penalty"`` (against float64), ``"unscaled"`` (against
    the step without GradScaler) or ``"skip"`` (an inf in the penalty's gradients)."""
    values = {
        "DEVICE": _device(device),
        "DTYPE": dtype_src(dtype),
        "WIDTH": repr(P.WIDTH),
        "BATCH": repr(P.BATCH),
        "SCALE": repr(P.SCALE),
    }
    code = PENALTY.fill("parameters", "step", judgement, values=values)
    allowance = {
        "penalty": "gamma_(n+1)(2^-24) x the float64 norm (Higham 3.1)",
        "unscaled": "exact: scaling by a power of two and unscaling by hand",
        "skip": "exact: the step skipped bitwise and the scale halved once",
    }[judgement]
    what = f"the gradient penalty under GradScaler and {dtype} autocast ({judgement})"
    return FailureRepro("patterns", what, code, allowance, device=device.type)


def resume_repro(device: torch.device, dtype: torch.dtype) -> FailureRepro:
    """A run saved after ``resume_at`` steps and resumed in fresh objects against the uninterrupted one."""
    values = {
        "DEVICE": _device(device),
        "DTYPE": dtype_src(dtype),
        "WIDTH": repr(R.WIDTH),
        "BATCH": repr(R.BATCH),
        "STEPS": repr(R.STEPS),
        "RESUME_AT": repr(R.SAVE_AT),
        "GROWTH_INTERVAL": repr(R.GROWTH_INTERVAL),
        "INIT_SCALE": repr(R.INIT_SCALE),
    }
    code = RESUME.fill("parameters", "resume", values=values)
    what = f"save and resume under {dtype} autocast: the resumed run parts from the uninterrupted one"
    return FailureRepro(
        "patterns", what, code, "exact: losses, scales and final parameters bitwise", device=device.type
    )


def no_sync_repro(device: str, inf_at: list[int] | None) -> FailureRepro | None:
    """DDP accumulation under ``no_sync`` on two forked gloo ranks: clean (``inf_at`` None), one
    scale and one synchronised gradient within its float64 budget; with an inf at ``[rank,
    micro-batch]``, every rank skipping. None off the CPU (NCCL ranks are not a script's)."""
    if device != "cpu":
        return None
    values = {"WORLD": "2", "MICRO_BATCHES": repr(A.MICRO_BATCHES), "INF_AT": repr(inf_at)}
    judgement = "no_sync_sum" if inf_at is None else "no_sync_skip"
    code = RANKS.fill("prelude", "no_sync", "launch", judgement, "verdict", values=values)
    what = "DDP accumulation under no_sync(): " + (
        "the synchronised gradient" if inf_at is None else f"an inf at {inf_at}"
    )
    allowance = (
        "gamma_(k+world-2)(2^-24) of the micro-batches' magnitudes" if inf_at is None else "exact: every rank skips"
    )
    return FailureRepro("patterns", what, code, allowance, device="cpu")


def fsdp2_checkpoint_repro(device: str, dtype: str, checkpoint: str, policy: bool = False) -> FailureRepro | None:
    """FSDP2 with checkpointed blocks (``checkpoint``: ``module:function``) under ``dtype`` autocast,
    or (``policy``) checkpointed units under a ``MixedPrecisionPolicy`` to ``dtype``, on two forked
    gloo ranks, against the same model without checkpointing, bit for bit."""
    if device != "cpu":
        return None
    values = {"WORLD": "2", "DTYPE": f"torch.{dtype}", "CHECKPOINT": repr(checkpoint)}
    program = ("fsdp2_checkpoint", "fsdp2_policy_checkpoint") if policy else ("fsdp2_checkpoint",)
    code = RANKS.fill("prelude", *program, "launch", "fsdp2_same", "verdict", values=values)
    what = (
        f"checkpointed FSDP2 units under a {dtype} MixedPrecisionPolicy: shards unlike the unchecked model's"
        if policy
        else f"checkpointed blocks inside FSDP2 units under {dtype} autocast: shards unlike the unchecked model's"
    )
    needs = tuple(sorted({"torch", checkpoint.partition(":")[0].split(".")[0]}))
    return FailureRepro(
        "patterns", what, code, "exact: the recomputation runs in the forward's precision", needs=needs, device="cpu"
    )
