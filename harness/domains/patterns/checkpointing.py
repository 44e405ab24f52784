"""Activation checkpointing under autocast: recomputation must run under the autocast state of the
original forward (enabled, dtype, cache), so the gradients of a checkpointed model are the
gradients of the same model without checkpointing, bit for bit on a deterministic stack.

Four documented forms: ``torch.utils.checkpoint.checkpoint`` reentrant and non-reentrant,
``checkpoint_sequential``, and selective checkpointing (``create_selective_checkpoint_contexts``,
matmuls saved, the rest recomputed). The reference is the model run without any of them. A form
that recomputes in another precision gives other gradients, or raises (non-reentrant checkpointing
checks the recomputed tensors' metadata): both are a failed claim, never a crash of the check.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import checkpoint as ckpt

from harness.domains.engines.state import same_bits
from harness.domains.patterns import problems_claim
from harness.numerics.comparison import ClaimComparison, compare_claim

#: The forms checked, as the AMP examples page and torch.utils.checkpoint document them.
VARIANTS = ("reentrant", "non_reentrant", "sequential", "selective")
WIDTH, BLOCKS, BATCH = 32, 3, 16
#: The loss scale of the fp16 steps: one GradScaler settles at on this model (its default first
#: scale, 2^16, overflows the fp16 backward here, and a skipped step compares nothing).
SCALE = 2.0**8


#: The forms checked on a layer shared by two checkpointed regions: reentrant checkpointing is left
#: out, its recomputation giving each use of the shared weight a cast of its own whose gradient is
#: accumulated in fp32, where the model without checkpointing sums the uses' low-precision gradients
#: of one cached cast first (a rounding apart, not a recomputation in another precision).
SHARED_VARIANTS = ("non_reentrant", "sequential", "selective")


def model(seed: int = 0, shared: bool = False) -> nn.Sequential:
    """Three blocks of linear -> GELU -> LayerNorm (every op autocast has a rule for), then a head;
    ``shared``: the third block is the first again (a shared layer, tied weights)."""
    torch.manual_seed(seed)
    blocks = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.LayerNorm(WIDTH)) for _ in range(BLOCKS)]
    if shared:
        blocks[-1] = blocks[0]
    return nn.Sequential(*blocks, nn.Linear(WIDTH, 1))


def batch(device: torch.device, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, 1, generator=g)
    return x.to(device), y.to(device)


def _selective_policy(ctx: object, op: object, *args: object, **kwargs: object) -> ckpt.CheckpointPolicy:
    """Save the matmuls' outputs, recompute the rest (the recipe LLM trainings use)."""
    saved = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
    return ckpt.CheckpointPolicy.MUST_SAVE if op in saved else ckpt.CheckpointPolicy.PREFER_RECOMPUTE


def missing(variant: str) -> str | None:
    """Why this torch has no ``variant`` of checkpointing (None where it has): selective
    checkpointing's ``create_selective_checkpoint_contexts`` came after torch 2.4."""
    if variant == "selective" and not hasattr(ckpt, "create_selective_checkpoint_contexts"):
        return f"torch {torch.__version__} has no selective checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts)"
    return None


def forward(m: nn.Sequential, x: torch.Tensor, variant: str | None) -> torch.Tensor:
    """``m`` on ``x`` with its blocks checkpointed in ``variant`` (None: not checkpointed)."""
    blocks, head = list(m)[:-1], m[-1]
    h = x
    if variant is None:
        for b in blocks:
            h = b(h)
    elif variant == "sequential":
        h = ckpt.checkpoint_sequential(nn.Sequential(*blocks), 2, h, use_reentrant=False)  # type: ignore[no-untyped-call]
    elif variant == "selective":
        contexts = functools.partial(ckpt.create_selective_checkpoint_contexts, _selective_policy)
        for b in blocks:
            h = ckpt.checkpoint(b, h, use_reentrant=False, context_fn=contexts)
    elif variant in ("reentrant", "non_reentrant"):
        for b in blocks:
            h = ckpt.checkpoint(b, h, use_reentrant=variant == "reentrant")
    else:
        raise ValueError(f"unknown checkpointing variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    out: torch.Tensor = head(h)
    return out


class _TableBlock(nn.Module):
    """A layer that gets a table its parent computed in fp32 beside the hidden state, as Hugging
    Face's decoder layers get the rotary embeddings' cos and sin."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, h: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(h) * table)


class TableNet(nn.Module):
    """Blocks that each get the same fp32 table from this module's forward, each called through
    ``checkpoint`` (non-reentrant) when one is given, then a head: the shape of a transformer with
    gradient checkpointing whose layers are FSDP2 units under a ``MixedPrecisionPolicy`` (the unit
    casts its inputs, the table among them, to the policy's dtype)."""

    def __init__(self, checkpoint: Callable[..., torch.Tensor] | None = None, width: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.checkpoint = checkpoint
        self.blocks = nn.ModuleList([_TableBlock(width) for _ in range(BLOCKS)])
        self.head = nn.Linear(width, 1)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        width = h.shape[-1]
        table = torch.cos(torch.arange(width, dtype=torch.float32, device=h.device) / width)
        for block in self.blocks:
            h = block(h, table) if self.checkpoint is None else self.checkpoint(block, h, table, use_reentrant=False)
        out: torch.Tensor = self.head(h)
        return out


@dataclass(frozen=True)
class Gradients:
    """What one backward under autocast produced: each parameter's gradient (scaled, for fp16 as
    GradScaler's first step scales them), or the error the backward raised."""

    grads: dict[str, torch.Tensor]
    error: str | None = None


#: The forms checked under ``torch.compile``: Dynamo traces non-reentrant checkpointing (and the
#: selective form) into the graph; a reentrant checkpoint is an autograd.Function it runs outside
#: the graph, and tracing ``checkpoint_sequential`` warns that it reads a non-leaf's ``.grad``
#: (torch 2.13), which the suites treat as an error.
COMPILED_VARIANTS = ("non_reentrant", "selective")

#: The backend the compiled cells compile with (the negative controls swap it for a faulty one).
COMPILE_BACKEND: object = "inductor"

#: The backend of the partitioned cells: Dynamo and AOTAutograd with Inductor's decompositions and
#: its min-cut partitioner, which decides what the backward recomputes, and no code generation (the
#: graphs run on eager kernels). It judges the compiler's recomputation on every device: two graphs
#: of eager kernels round alike where the kernels repeat, so no budget for differently fused code is
#: needed (the negative controls swap it for a faulty one).
PARTITION_BACKEND: object = "aot_eager_decomp_partition"


def gradients(
    variant: str | None,
    device: torch.device,
    dtype: torch.dtype,
    scale: float,
    inject: Callable[[nn.Module], object] | None = None,
    compile: Callable[[Callable[..., torch.Tensor]], Callable[..., torch.Tensor]] | None = None,
    shared: bool = False,
) -> Gradients:
    """One forward (checkpointed in ``variant``) and backward of the loss times ``scale``, under
    autocast to ``dtype``; ``inject(model)`` may plant a fault (a hook) first; ``compile`` wraps
    the forward (``torch.compile``), checkpointing and all; ``shared``: the model whose first block
    is also its third."""
    m = model(shared=shared).to(device)
    if inject is not None:
        inject(m)
    x, y = batch(device)
    x.requires_grad_(True)  # reentrant checkpointing sends gradients only through inputs that need them
    run: Callable[..., torch.Tensor] = functools.partial(forward, variant=variant)
    if compile is not None:
        run = compile(run)
    try:
        with torch.autocast(device.type, dtype=dtype):
            out = run(m, x)
        loss = nn.functional.mse_loss(out.float(), y)
        torch.autograd.backward(loss * scale)
    except Exception as exc:  # a recomputation that fails its own checks is the verdict, not a crash
        return Gradients({}, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return Gradients(grads)


def differing(a: Gradients, b: Gradients) -> list[str]:
    """The parameters whose gradients are not bitwise equal (NaN equal to NaN), or the error."""
    if a.error or b.error:
        return [f"raised {a.error or b.error}"]
    names = sorted(a.grads.keys() | b.grads.keys())
    out = []
    for n in names:
        x, y = a.grads.get(n), b.grads.get(n)
        if x is None or y is None or not same_bits(x, y):
            out.append(n)
    return out


@dataclass(frozen=True)
class OverflowStep:
    """One GradScaler step whose backward overflowed inside a recomputed block."""

    params_untouched: bool
    state_untouched: bool
    scale_before: float
    scale_after: float
    #: the warm-up step before it was taken (its momentum buffers are the state compared)
    warmup_taken: bool
    error: str | None = None


def overflow_in_a_recomputed_block(variant: str, device: torch.device, dtype: torch.dtype) -> OverflowStep:
    """An SGD (momentum) step with GradScaler whose checkpointed middle block produces inf in the
    forward and in its recomputation: the step must be skipped (parameters and optimizer state
    bitwise as they were) and the scale backed off once (x0.5)."""
    m = model().to(device)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, init_scale=SCALE)
    x, y = batch(device)
    x.requires_grad_(True)
    # a warm-up step fills the momentum buffers, so "state untouched" has state to compare
    for overflow in (False, True):
        opt.zero_grad(set_to_none=True)
        handle = m[1].register_forward_hook(lambda _m, _i, out: out * math.inf) if overflow else None
        before = [p.detach().clone() for p in m.parameters()]
        state = [t.clone() for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        scale_before = scaler.get_scale()
        try:
            with torch.autocast(device.type, dtype=dtype):
                out = forward(m, x, variant)
            torch.autograd.backward(scaler.scale(nn.functional.mse_loss(out.float(), y)))
            scaler.step(opt)
            scaler.update()
        except Exception as exc:  # the verdict is what the step did; an error is its own answer
            return OverflowStep(False, False, scale_before, scale_before, False, f"{type(exc).__name__}: {exc}")
        finally:
            if handle is not None:
                handle.remove()
    after_state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return OverflowStep(
        all(torch.equal(b, p) for b, p in zip(before, m.parameters(), strict=True)),
        len(state) == len(after_state) and all(torch.equal(b, a) for b, a in zip(state, after_state, strict=True)),
        scale_before,
        scaler.get_scale(),
        scale_before == SCALE and len(state) > 0,
    )


# -- the claims: each check's verdict, decided here -------------------------------------------------
def gradients_claim(
    reference: Gradients,
    checked: Gradients,
    variant: str,
    dtype: object,
    cell: str | None = None,
    what: str | None = None,
) -> ClaimComparison:
    """The checkpointed model's gradients equal the unchecked model's, bit for bit (``cell`` and
    ``what``: a compiled cell, e.g. ``"partitioned"``, "traced and partitioned by the compiler")."""
    wrong = differing(reference, checked)
    if cell is None:
        name, criterion = (
            f"checkpoint.{variant}.gradients_differing",
            ("the checkpointed model's gradients equal the unchecked model's, bit for bit"),
        )
        detail = (
            f"{variant} checkpointing under {dtype} autocast: {', '.join(wrong)} differ from the model "
            "without checkpointing (recomputation in another precision?)"
        )
    else:
        name = f"checkpoint.{cell}_{variant}.gradients_differing"
        criterion = (
            f"{what} with its blocks checkpointed, the model's gradients equal the {what} unchecked model's, bit "
            "for bit"
        )
        detail = (
            f"{variant} checkpointing {what} under {dtype} autocast: {', '.join(wrong)} differ "
            f"from the model {what} without checkpointing (the recomputation ran something else)"
        )
    return compare_claim(
        name, len(wrong), not wrong, criterion, detail=detail, expected=0, allowance=0, unit="parameters"
    )


def shared_gradients_claim(reference: Gradients, checked: Gradients, variant: str, dtype: object) -> ClaimComparison:
    """With one layer in two checkpointed regions, the model's gradients equal the unchecked
    model's, bit for bit."""
    wrong = differing(reference, checked)
    return compare_claim(
        f"checkpoint.shared_{variant}.gradients_differing",
        len(wrong),
        not wrong,
        "with one layer in two checkpointed regions, the model's gradients equal the unchecked model's, bit for bit",
        detail=f"{variant} checkpointing of a layer used twice under {dtype} autocast: {', '.join(wrong)} differ from "
        "the model without checkpointing (a recomputation that does not replay the forward's casts?)",
        expected=0,
        allowance=0,
        unit="parameters",
    )


def replay_lost_a_cast(checked: Gradients) -> bool:
    """Whether ``checked`` failed in the shape of the registered selective-checkpointing issue: SAC's
    replay found a weight cast in the recomputation that the forward (served by autocast's cache)
    never recorded."""
    return checked.error is not None and "_to_copy" in checked.error and "not found in storage" in checked.error


def sequential_drops_repeats() -> tuple[bool, str]:
    """``checkpoint_sequential`` on ``nn.Sequential(a, b, a)`` in fp32, against the Sequential called:
    whether the checkpointed output differs (the repeat skipped), and what was seen."""
    torch.manual_seed(0)
    shared, middle = nn.Linear(8, 8), nn.Linear(8, 8)
    seq = nn.Sequential(shared, middle, shared)
    x = torch.randn(4, 8, requires_grad=True)
    called = seq(x)
    checkpointed = ckpt.checkpoint_sequential(seq, 2, x, use_reentrant=False)  # type: ignore[no-untyped-call]
    differs = not torch.equal(called, checkpointed)
    seen = f"outputs {'differ' if differs else 'equal'}: the Sequential has {len(seq)} entries, {len(list(seq.children()))} children"
    return differs, seen


def overflow_step_claim(step: OverflowStep, variant: str) -> ClaimComparison:
    """An inf in a recomputed block skips the step (parameters and optimizer state bitwise
    unchanged, after a warm-up step that was taken) and halves the scale once."""
    problems = (
        [f"raised {step.error}"]
        if step.error
        else [
            *([] if step.warmup_taken else ["the warm-up step was not taken: nothing to compare the state with"]),
            *([] if step.params_untouched else ["parameters changed"]),
            *([] if step.state_untouched else ["optimizer state changed"]),
            *(
                []
                if step.scale_after == step.scale_before * 0.5
                else [f"scale {step.scale_before} -> {step.scale_after}"]
            ),
        ]
    )
    return problems_claim(
        f"checkpoint.{variant}.overflow_step_problems",
        problems,
        "an inf in a recomputed block skips the step (parameters and optimizer state bitwise unchanged) "
        "and halves the scale once",
        variant,
    )


#: What each FSDP2 form checks, for the claims' criteria (``rank_programs.fsdp2_checkpointed_gradients``).
FSDP2_FORMS = {
    "autocast": "checkpointed blocks inside FSDP2 units recompute under the forward's autocast",
    "policy": "checkpointed FSDP2 units under a MixedPrecisionPolicy recompute on the inputs the policy cast",
}


def fsdp2_problems(per_rank: list[dict[str, object]], form: str) -> list[str]:
    """Per rank, what the checkpointed backward of ``form`` raised, or that its gradient shards
    differ from the unchecked model's."""
    problems = []
    for rank, seen in enumerate(per_rank):
        both = seen[form]
        assert isinstance(both, dict)
        checked, plain = both["checkpointed"], both["plain"]
        if "raised" in checked:
            problems.append(f"rank {rank}: the checkpointed backward raised {checked['raised']}")
        elif "raised" in plain:
            problems.append(f"rank {rank}: the model without checkpointing raised {plain['raised']}")
        elif checked["grads"] != plain["grads"]:
            problems.append(f"rank {rank}: gradient shards differ from the model without checkpointing")
    return problems


def fsdp2_claim(per_rank: list[dict[str, object]], dtype: str, form: str = "autocast") -> ClaimComparison:
    """Every rank's averaged gradient shards with checkpointing equal those without, bit for bit
    (``per_rank``: ``rank_programs.fsdp2_checkpointed_gradients``; ``form``: a key of :data:`FSDP2_FORMS`)."""
    return problems_claim(
        f"fsdp2_checkpointing.{dtype}.problems"
        if form == "autocast"
        else f"fsdp2_{form}_checkpointing.{dtype}.problems",
        fsdp2_problems(per_rank, form),
        f"{FSDP2_FORMS[form]}: every rank's averaged gradient shards equal those without checkpointing, bit for bit",
    )


def fsdp2_unchecked_ran(per_rank: list[dict[str, object]], form: str) -> bool:
    """Whether every rank's model without checkpointing ran: a failure of the checkpointed one alone
    is a recomputation's, the shape of a registered issue."""
    return all("raised" not in r[form]["plain"] for r in per_rank)  # type: ignore[index]


def reference_ran_claim(reference: Gradients, dtype: object) -> ClaimComparison:
    """The compiled model without checkpointing compiles and runs: a reference that cannot is the
    compiler's failure, not a kernel's noise."""
    return compare_claim(
        "checkpoint.partitioned_reference_raised",
        int(reference.error is not None),
        reference.error is None,
        "the model without checkpointing compiles and runs, traced and partitioned by the compiler",
        detail=f"under {dtype} autocast it raised {reference.error}",
        expected=0,
        allowance=0,
        unit="errors",
    )
