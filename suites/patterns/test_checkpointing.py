"""Activation checkpointing under autocast recomputes the forward in the forward's precision.

The AMP examples' claim: a checkpointed block's recomputation runs under the autocast state of the
original forward. Reference: the same model without checkpointing; where the reference repeats bit for bit
(the CPU; a GPU's deterministic kernels), the gradients must be equal bit for bit (any recomputation in another precision
changes them, or makes non-reentrant checkpointing raise). Overflow inside a recomputed block must
skip the step as GradScaler's documentation says: parameters and optimizer state bitwise as they
were, the scale backed off once.

A layer used in two checkpointed regions (a shared layer, tied weights) must give the unchecked
model's gradients too. From torch 2.13 selective checkpointing's replay raises there: the second
region's forward takes autocast's cached weight cast and records none, its recomputation casts
(pytorch/pytorch#193338, open); registered as a known issue, KNOWN where the registry lists it and
observed by the registry check every run. ``checkpoint_sequential`` runs a module an
``nn.Sequential`` holds twice only once, silently, on every release (its children() list each
module once): registered too."""

from __future__ import annotations

import pytest
import torch

from harness.domains.engines.compiler import compiling
from harness.domains.patterns import COMPILED_CPU_ONLY, known_issues, repeated
from harness.domains.patterns import checkpointing as C
from harness.domains.patterns.known_issues import (
    FSDP2_POLICY_RECOMPUTE,
    SELECTIVE_SHARED,
    SEQUENTIAL_REPEATS,
    WHERE,
)
from harness.domains.patterns.repro import (
    checkpointing_overflow_repro,
    checkpointing_repro,
    fsdp2_checkpoint_repro,
)

pytestmark = pytest.mark.amp_capability("training parity")


def _needs(variant: str) -> None:
    """Skip, naming the release and the feature, a variant this torch does not have."""
    why = C.missing(variant)
    if why is not None:
        pytest.skip(why)


def _scale(dtype: torch.dtype) -> float:
    return C.SCALE if dtype == torch.float16 else 1.0


@pytest.mark.parametrize("variant", C.VARIANTS)
def test_checkpointed_gradients_equal_the_unchecked_models_bit_for_bit(variant, amp_device, amp_dtype, amp_record):
    _needs(variant)
    reference, unstable = repeated(lambda: C.gradients(None, amp_device, amp_dtype, _scale(amp_dtype)), C.differing)
    amp_record.require_repeatable("checkpoint.reference_unrepeatable", unstable, device=amp_device, dtype=amp_dtype)
    checked = C.gradients(variant, amp_device, amp_dtype, _scale(amp_dtype))
    amp_record.require(
        C.gradients_claim(reference, checked, variant, amp_dtype),
        device=amp_device,
        dtype=amp_dtype,
        tags={"variant": variant, "parameters": len(reference.grads), "loss_scale": _scale(amp_dtype)},
        repro=checkpointing_repro(amp_device, amp_dtype, variant, _scale(amp_dtype)),
    )


#: the registered issue each shared-layer form fails with on the releases that have it
SHARED_ISSUES = {"selective": SELECTIVE_SHARED, "sequential": SEQUENTIAL_REPEATS}

#: the shared-layer model's reference per device and dtype: the variants share it
_SHARED_REFERENCE: dict[tuple[str, torch.dtype], C.Gradients] = {}


def _shared(variant: str | None, amp_device, amp_dtype) -> C.Gradients:
    return C.gradients(variant, amp_device, amp_dtype, _scale(amp_dtype), shared=True)


@pytest.mark.parametrize("variant", C.SHARED_VARIANTS)
def test_a_layer_in_two_checkpointed_regions_gets_the_unchecked_models_gradients_bit_for_bit(
    variant, amp_device, amp_dtype, amp_record
):
    _needs(variant)
    key = (str(amp_device), amp_dtype)
    if key not in _SHARED_REFERENCE:
        reference, unstable = repeated(lambda: _shared(None, amp_device, amp_dtype), C.differing)
        amp_record.require_repeatable(
            "checkpoint.shared_reference_unrepeatable", unstable, device=amp_device, dtype=amp_dtype
        )
        _SHARED_REFERENCE[key] = reference
    checked = _shared(variant, amp_device, amp_dtype)
    result = C.shared_gradients_claim(_SHARED_REFERENCE[key], checked, variant, amp_dtype)
    kw = {
        "device": amp_device,
        "dtype": amp_dtype,
        "tags": {"variant": variant, "shared": True, "loss_scale": _scale(amp_dtype)},
        "repro": checkpointing_repro(amp_device, amp_dtype, variant, _scale(amp_dtype), shared=True),
    }
    if variant not in SHARED_ISSUES:
        amp_record.require(result, **kw)
        return
    shape = C.replay_lost_a_cast(checked) if variant == "selective" else checked.error is None
    # the registry looked up per run: a test may swap it
    amp_record.require_unless_known(result, known_issues.KNOWN_ISSUES[SHARED_ISSUES[variant]], its_shape=shape, **kw)


@pytest.mark.parametrize("issue", sorted(SHARED_ISSUES.values()))
def test_known_issue_status_matches_the_registry(issue, amp_device, amp_record):
    """Each shared-layer issue observed: SAC's replay missing a weight cast (the shared-layer model
    under bf16 autocast), ``checkpoint_sequential`` skipping a repeated module (fp32); present where
    the registry lists it is KNOWN, absent there or present outside its range fails naming the edit."""
    if issue == SELECTIVE_SHARED:
        _needs("selective")
        checked = _shared("selective", amp_device, torch.bfloat16)
        present, seen = C.replay_lost_a_cast(checked), checked.error or "the selectively checkpointed backward ran"
    else:
        present, seen = C.sequential_drops_repeats()
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[issue], present, f"{WHERE} ({issue!r})", seen=seen, device=amp_device
    )


@pytest.mark.parametrize("variant", C.VARIANTS)
def test_an_overflow_in_a_recomputed_block_skips_the_step_and_backs_off_once(variant, amp_device, amp_record):
    _needs(variant)
    step = C.overflow_in_a_recomputed_block(variant, amp_device, torch.float16)
    amp_record.require(
        C.overflow_step_claim(step, variant),
        repro=checkpointing_overflow_repro(amp_device, variant),
        device=amp_device,
        dtype=torch.float16,
        tags={"variant": variant, "scale_before": step.scale_before, "scale_after": step.scale_after},
    )


# -- inside FSDP2 units ----------------------------------------------------------------------------
_FSDP2: dict[tuple[str, str], list] = {}


def _fsdp2(dtype: str) -> list:
    """Both FSDP2 forms' observations on two ranks (gloo on the CPU, NCCL on two GPUs), one launch
    per dtype and checkpoint function: the cells and the registry check share it."""
    from harness.domains.engines.ranks import ranks
    from harness.domains.patterns import rank_programs
    from harness.platform import compat

    if torch.cuda.device_count() < 2 and compat.fsdp2_missing() is not None:
        pytest.skip(compat.fsdp2_missing())
    key = (rank_programs.CHECKPOINT, dtype)  # read here: the negative controls swap the checkpoint function
    if key not in _FSDP2:
        _FSDP2[key] = ranks.launch(
            rank_programs.fsdp2_checkpointed_gradients, world=2, dtype=dtype, checkpoint=rank_programs.CHECKPOINT
        )
    return _FSDP2[key]


@pytest.mark.amp_capability("distributed")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_checkpointed_blocks_inside_fsdp2_units_give_the_unchecked_gradients_bit_for_bit(dtype, amp_record):
    """FSDP2 over every Linear under autocast: the checkpointed pairs' averaged gradient shards must
    equal those of the same FSDP2 model without checkpointing."""
    from harness.domains.patterns import rank_programs

    per_rank = _fsdp2(dtype)
    amp_record.require(
        C.fsdp2_claim(per_rank, dtype),
        repro=fsdp2_checkpoint_repro(str(per_rank[0]["device"]), dtype, rank_programs.CHECKPOINT),
        dtype=dtype,
        device=per_rank[0]["device"],
    )


@pytest.mark.amp_capability("distributed")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_checkpointed_fsdp2_units_under_a_mixed_precision_policy_give_the_unchecked_gradients_bit_for_bit(
    dtype, amp_record
):
    """FSDP2 units under ``MixedPrecisionPolicy(param_dtype=dtype)``, each checkpointed as Hugging
    Face's gradient checkpointing wraps its layers and each given an fp32 table by its parent (rotary
    embeddings): the recomputation must run on the inputs the policy cast, so the averaged gradient
    shards equal those without checkpointing. From 2.7 (FSDP2 on the CPU) to 2.12 the recomputation
    skipped the cast (pytorch/pytorch#148831): KNOWN through the registry there."""
    from harness.domains.patterns import rank_programs

    per_rank = _fsdp2(dtype)
    amp_record.require_unless_known(
        C.fsdp2_claim(per_rank, dtype, "policy"),
        known_issues.KNOWN_ISSUES[FSDP2_POLICY_RECOMPUTE],  # looked up per run: a test may swap the registry
        device=per_rank[0]["device"],
        dtype=dtype,
        its_shape=C.fsdp2_unchecked_ran(per_rank, "policy"),
        repro=fsdp2_checkpoint_repro(str(per_rank[0]["device"]), dtype, rank_programs.CHECKPOINT, policy=True),
    )


@pytest.mark.amp_capability("distributed")
def test_fsdp2_known_issue_status_matches_the_registry(amp_record):
    """The policy form under bf16 (the cells' own launch), observed: the checkpointed units failing
    where the registry lists the issue is KNOWN; bit for bit there, or failing outside its range,
    fails naming the edit."""
    per_rank = _fsdp2("bfloat16")
    problems = C.fsdp2_problems(per_rank, "policy")
    amp_record.require_registry(
        known_issues.KNOWN_ISSUES[FSDP2_POLICY_RECOMPUTE],
        bool(problems) and C.fsdp2_unchecked_ran(per_rank, "policy"),
        f"{WHERE} ({FSDP2_POLICY_RECOMPUTE!r})",
        seen="; ".join(problems) or "every rank's shards bit for bit",
        device=torch.device(str(per_rank[0]["device"])),
    )


# -- under torch.compile ---------------------------------------------------------------------------
def _record_compiled(
    cell: str, what: str, variant, amp_device, amp_dtype, amp_record, reference, checked, tags, backend
) -> None:
    """One verdict for both compiled cells: every gradient ``what`` with checkpointing bit for bit as
    without; its script compiles both models with ``backend`` (None: the script cannot)."""
    amp_record.require(
        C.gradients_claim(reference, checked, variant, amp_dtype, cell=cell, what=what),
        device=amp_device,
        dtype=amp_dtype,
        tags={"variant": variant, **tags},
        repro=None
        if backend is None
        else checkpointing_repro(amp_device, amp_dtype, variant, _scale(amp_dtype), backend),
    )


#: the partitioned cells' reference (run twice) per device, dtype and backend: the variants share it
_PARTITIONED: dict[tuple[str, torch.dtype, str], tuple[C.Gradients, list[str]]] = {}


@pytest.mark.amp_thorough_dtypes("fp16", on="cpu")  # fp16's cells take bf16's code path; both on CUDA
@pytest.mark.parametrize("variant", C.COMPILED_VARIANTS)
def test_checkpointed_blocks_partitioned_by_the_compiler_give_its_unchecked_gradients_bit_for_bit(
    variant, amp_device, amp_dtype, amp_record
):
    """The compiler's recomputation, without its code generation: Dynamo traces the checkpointed
    blocks, AOTAutograd with Inductor's decompositions and min-cut partitioner decides what the
    backward recomputes, and both graphs run on eager kernels. Against the same model compiled so
    without checkpointing, bit for bit where that reference repeats (every device; no C++)."""
    _needs(variant)
    backend = C.PARTITION_BACKEND  # read here: the negative controls swap it

    def run(v):
        return C.gradients(
            v, amp_device, amp_dtype, _scale(amp_dtype), compile=lambda f: compiling.compile_fn(f, backend)
        )

    key = (str(amp_device), amp_dtype, str(backend))
    if key not in _PARTITIONED:
        _PARTITIONED[key] = repeated(lambda: run(None), C.differing)
    reference, unstable = _PARTITIONED[key]
    tags = {"backend": str(backend)}
    amp_record.require(  # a reference that cannot run is the compiler's failure, not a kernel's noise
        C.reference_ran_claim(reference, amp_dtype),
        device=amp_device,
        dtype=amp_dtype,
        tags=tags,
    )
    amp_record.require_repeatable(
        "checkpoint.partitioned_reference_unrepeatable", unstable, device=amp_device, dtype=amp_dtype
    )
    what = "traced and partitioned by the compiler"
    checked = run(variant)
    _record_compiled("partitioned", what, variant, amp_device, amp_dtype, amp_record, reference, checked, tags, backend)


@pytest.mark.amp_thorough_on("cpu")  # two Inductor compiles per form and dtype: about 40 s cold on 2 CPU cores
@pytest.mark.parametrize("variant", C.COMPILED_VARIANTS)
def test_compiled_checkpointed_blocks_give_the_compiled_unchecked_gradients_bit_for_bit(
    variant, amp_device, amp_dtype, amp_record, amp_fingerprint
):
    """The model compiled with its blocks checkpointed against the same model compiled without: the
    partitioner's recomputation must run what the forward ran, in the code Inductor generates. Where
    Inductor is registered to elide eager's roundings (``inductor-elides-eager-roundings``) its
    fusions differ between the two graphs in the last bits, so there both compile under that issue's
    remedy (``emulate_precision_casts``)."""
    _needs(variant)
    import contextlib

    from harness.domains import known_issues
    from harness.domains.engines.compiler import toolchain

    if amp_device.type != "cpu":
        pytest.skip(COMPILED_CPU_ONLY)
    missing = toolchain.unavailable(amp_device.type)
    if missing is not None:
        pytest.skip(f"no working compiler toolchain: {missing}")
    backend = C.COMPILE_BACKEND  # read here: the negative controls swap it
    emulate = backend == "inductor" and known_issues.REGISTRIES["inductor-elides-eager-roundings"][1].listed(
        torch.__version__, amp_device.type, amp_fingerprint.class_for(str(amp_device)).id
    )
    config = compiling.configured(compiling.EMULATED_CASTS) if emulate else contextlib.nullcontext()
    with config:
        reference = C.gradients(
            None, amp_device, amp_dtype, _scale(amp_dtype), compile=lambda f: compiling.compile_fn(f, backend)
        )
        checked = C.gradients(
            variant, amp_device, amp_dtype, _scale(amp_dtype), compile=lambda f: compiling.compile_fn(f, backend)
        )
    tags = {"emulate_precision_casts": emulate, "backend": str(backend)}
    # under the remedy's configuration the script, which compiles with Inductor's defaults, would differ
    script_backend = None if emulate else backend
    _record_compiled(
        "compiled", "compiled", variant, amp_device, amp_dtype, amp_record, reference, checked, tags, script_backend
    )
