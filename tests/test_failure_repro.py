"""A failed check becomes a bug report: ``amp-harness repro --report`` writes, for each failed check
that recorded its failing example, a script that needs only torch (and torchao); it exits 1 on the
faulty stack and 0 on the clean one, run in a fresh interpreter that cannot import this harness.

The faults are harness-free patches of torch and torchao (``faults.stacks``), installed both in the
suite's run (an injected conftest) and in the script's interpreter: an autocast op (layer_norm run
in low precision), a loss scaler (GradScaler.update that never backs off) and an fp8 scale
(torchao's tensor_to_scale doubled).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from faults import stacks
from helpers import BASELINES, assert_caught, faulty_driver, inject, run_inner, unbound_names

from harness.apps.cli import main
from harness.platform import kernels

# torchao is imported here, before any test: imported inside a test, pytester's module snapshot
# would unload it at teardown while torch keeps the operator library it registered, and a later
# torch.compile in this process would register that library again and fail
try:
    import torchao.float8  # noqa: F401

    HAS_TORCHAO = True
except ImportError:
    HAS_TORCHAO = False


#: fault -> (suite file, -k selection, the failed tests it must show)
CONTROLS = {
    "layer_norm_in_low_precision": (
        "autocast/test_op_numerics.py",
        "derived_budget and bf16-layer_norm]",
        ("*derived_budget*bf16-layer_norm]",),
    ),
    "scaler_never_backs_off": (
        "scaler/test_overflow_in_training.py",
        "injected_overflow and backward and GradScaler and not Sharded",
        ("*injected_overflow*[[]GradScaler-cpu-backward-inf]",),
    ),
    # the gradient census's scaler claim: the script steps GradScaler once from the census's state
    "scaler_never_backs_off/census": (
        "training/test_gradient_census.py",
        "census",
        ("*recorded_and_consistent[[]cpu]",),
    ),
    "scaler_stepping_on_overflow/census": (
        "training/test_gradient_census.py",
        "census",
        ("*recorded_and_consistent[[]cpu]",),
    ),
    # a third-party scaler (where installed: tox -e thirdparty) against its release's rule: the
    # script replays the conformance machine's failing example on the scaler as the adapter drives it
    "megatron_scaler_never_backs_off": (
        "scaler/test_scaler_conformance.py",
        "installed and megatron",
        ("*installed_third_party_scaler*[[]megatron-core]",),
    ),
    "deepspeed_scaler_never_backs_off": (
        "scaler/test_scaler_conformance.py",
        "installed and deepspeed",
        ("*installed_third_party_scaler*[[]deepspeed]",),
    ),
    # one optimizer step under GradScaler: the script loads the step's parameters, state and gradients
    "sgd_without_weight_decay": (
        "scaler/test_optimizer_implementations.py",
        "optimizers_update_in_float64 and SGD-for-loop",
        ("*update_in_float64[[]cpu-SGD-for-loop]",),
    ),
    # pure low-precision training: the script loads the bf16 step and judges it in bf16's roundings
    "sgd_skipping_low_precision_parameters": (
        "scaler/test_optimizer_implementations.py",
        "low_precision_parameters and SGD-for-loop and bfloat16-gradscaler",
        ("*low_precision_parameters*[[]cpu-SGD-for-loop-bfloat16-gradscaler]",),
    ),
    # the same fault on fp16 parameters, which the optimizer steps alone
    "sgd_skipping_low_precision_parameters/alone": (
        "scaler/test_optimizer_implementations.py",
        "low_precision_parameters and SGD-for-loop and float16 and not bfloat16",
        ("*low_precision_parameters*[[]cpu-SGD-for-loop-float16]",),
    ),
    # checkpointing through the compiler's partitioner: the script compiles both models with the backend
    "compile_recomputing_in_fp32": (
        "patterns/test_checkpointing.py",
        "partitioned and bf16 and non_reentrant",
        ("*partitioned_by_the_compiler*[[]cpu-bf16-non_reentrant]",),
    ),
    "scaler_stepping_on_overflow": (
        "scaler/test_optimizer_implementations.py",
        "leaves_parameters and SGD-for-loop",
        ("*leaves_parameters*[[]cpu-SGD-for-loop]",),
    ),
    # the training patterns: gradient accumulation's effective batch, seeded as the check builds it
    "scaler_stepping_on_overflow/accumulation": (
        "patterns/test_accumulation.py",
        "inf_in_any_micro_batch and micro_batch_1",
        ("*inf_in_any_micro_batch*micro_batch_1]",),
    ),
    # one unscale_ -> clip_grad_norm_ -> step: the script loads the step's parameters, momentum and gradients
    "clip_grad_norm_in_bf16": (
        "scaler/test_clipping.py",
        "in_float64 and foreach",
        ("*clipping_in_float64[[]cpu-foreach]",),
    ),
    "clip_norm_sentinel": (
        "scaler/test_clipping.py",
        "non_finite_norm and for-loop",
        ("*non_finite_norm_and_gradscaler_skips*[[]cpu-for-loop]",),
    ),
    "clip_ignoring_error_if_nonfinite": (
        "scaler/test_clipping.py",
        "error_if_nonfinite and for-loop",
        ("*error_if_nonfinite_raises*[[]cpu-for-loop]",),
    ),
    "fp8_scale_doubled": (
        "fp8/test_fp8_scaling.py",
        "exact_reference and tensorwise-e4m3]",
        ("*exact_reference*tensorwise-e4m3]",),
    ),
    # the same fault against saturation: the scale script shows the scale too large for its tensor
    "fp8_scale_doubled/saturation": (
        "fp8/test_fp8_scaling.py",
        "never_relies_on_saturation and tensorwise-e4m3]",
        ("*never_relies_on_saturation*tensorwise-e4m3]",),
    ),
    "fp8_mx_scale_binade_high": (
        "block_scaled/test_block_linear.py",
        "mxfp8-rceil",
        ("*within_budget[[]mxfp8-rceil]",),
    ),
    # the same fault against the scale codes themselves: the script computes each block's code exactly
    "fp8_mx_scale_binade_high/scales": (
        "block_scaled/test_block_scale_codes.py",
        "mx_block_scales and e4m3-floor",
        ("*mx_block_scales_equal_the_reference[[]e4m3-floor]",),
    ),
    # the same fault against the block-scaled bits: the script holds torchao's bits to the
    # specification written out in exact rationals
    "fp8_mx_scale_binade_high/bits": (
        "block_scaled/test_block_scaling.py",
        "bits_equal_the_exact_reference and mxfp8-rceil",
        ("*bits_equal_the_exact_reference[[]mxfp8-rceil]",),
    ),
    # a fused op's inner op left uncast by autocast (torch 2.4/2.5's encoder fast path): the script
    # runs the encoder layer's inference under autocast
    "addmm_activation_autocast_uncast": (
        "autocast/test_module_fast_paths.py",
        "fast_path_runs and bf16 and TransformerEncoderLayer and not norm_first",
        ("*runs_under_autocast[[]cpu-bf16-TransformerEncoderLayer]",),
    ),
    # a block of zeros given the e8m0 NaN scale: the script dequantises torchao's cast of zeros
    "fp8_mx_zero_block_scale_nan": (
        "block_scaled/test_block_scaling.py",
        "zeros and mxfp8-rceil",
        ("*zeros_quantizes_to_zeros[[]mxfp8-rceil]",),
    ),
    # NVFP4's elements truncated: the script's reference with float32 evaluation's windows
    "fp8_nvfp4_elements_toward_zero": (
        "block_scaled/test_block_scaling.py",
        "bits_equal_the_exact_reference and nvfp4",
        ("*bits_equal_the_exact_reference[[]nvfp4]",),
    ),
    # the same fault in block-scaled training: the failed band names the first block-scaled linear over
    # budget, whose products the script takes again with torchao's calls
    "fp8_mx_scale_binade_high/training": (
        "block_scaled/test_block_training.py",
        "mlp_training and mxfp8-rceil",
        ("*block_scaled_mlp_training_stays_within_its_band[[]cpu-mxfp8-rceil]",),
    ),
    # the same fault against the AMP lane's step rule: the failed step claim names the first
    # block-scaled linear over budget in its worst step, whose products the script takes again
    "fp8_mx_scale_binade_high/steps": (
        "block_scaled/test_block_training.py",
        "as_accurate_as_correctly_rounded and mlp and mxfp8-rceil",
        ("*as_accurate_as_correctly_rounded_ones[[]cpu-mlp-mxfp8-rceil]",),
    ),
    # a tensorwise scaled product: the script calls torch._scaled_mm on the saved fp8 operands
    "fp8_scaled_mm_without_scale_b": (
        "fp8/test_scaled_matmul.py",
        "scaled_mm_is_within and tensorwise-e4m3xe4m3 and float32",
        ("*scaled_mm_is_within*[[]cpu-tensorwise-e4m3xe4m3-float32]",),
    ),
    # Float8Linear's products: the script converts a linear with torchao and takes its three products
    # a recipe whose operand's format changed: the script reads torchao's config against the spec
    "fp8_recipe_rowwise_grad_output_e5m2": (
        "fp8/test_fp8_scaling.py",
        "recipe_casts and rowwise",
        ("*recipe_casts_each_operand_as_its_specification_says[[]rowwise]",),
    ),
    "fp8_linear_scale_doubled": (
        "fp8/test_scaled_matmul.py",
        "float8_linear and tensorwise",
        ("*float8_linear_output_and_gradients_are_within_budget[[]cpu-tensorwise]",),
    ),
    # the same fault in float8 training: the failed band names the first linear over budget, whose
    # products the script takes again from the operands it saw
    "fp8_linear_scale_doubled/training": (
        "fp8/test_float8_training.py",
        "mlp_training and tensorwise",
        ("*float8_mlp_training_stays_within_the_fp32_seed_band[[]cpu-tensorwise]",),
    ),
    # the fp8 code tables: the scripts decode all 256 codes, or cast the failing probes
    "fp8_decode_subnormals_flushed": (
        "fp8/test_fp8_formats.py",
        "every_code_decodes and float8_e4m3fn",
        ("*every_code_decodes*[[]cpu-float8_e4m3fn]",),
    ),
    # fp4 (e2m1): the script decodes the 16 codes and casts the probes with torchao's kernels
    "fp8_f4_cast_toward_zero": (
        "fp8/test_fp8_formats.py",
        "fp4_e2m1",
        ("*fp4_e2m1_codes_and_rounding_match_the_reference*",),
    ),
    # stochastic rounding: the script draws from torchao's rounding and tests the counts exactly
    "fp8_sr_round_to_nearest": (
        "stochastic_rounding/test_stochastic_rounding.py",
        "unbiased",
        ("*every_draw_is_a_neighbour_and_the_draws_are_unbiased[[]bf16]",),
    ),
    # the same rounding drawing from a generator of its own: the script draws twice under one seed
    "fp8_sr_unseeded": (
        "stochastic_rounding/test_stochastic_rounding.py",
        "draws_differ",
        ("*draws_differ_between_seeds_and_repeat_with_one[[]bf16]",),
    ),
    "fp8_e4m3_cast_toward_zero": (
        "formats/test_fp8_casts.py",
        "rounds_every_value_and_midpoint and e4m3fn",
        ("*rounds_every_value_and_midpoint*[[]cpu-e4m3fn]",),
    ),
    "fp8_e8m0_cast_rounding_down": (
        "fp8/test_fp8_formats.py",
        "e8m0_rounds_to_the_nearest",
        ("*e8m0_rounds_to_the_nearest_power_of_two[[]cpu]",),
    ),
    # the same fault against the e8m0 golden table (ties, overflow): the script casts the probes that left it
    "fp8_e8m0_cast_rounding_down/baseline": (
        "fp8/test_fp8_formats.py",
        "ties_zero_sign_and_overflow",
        ("*e8m0_ties_zero_sign_and_overflow_match_this_stacks_baseline*",),
    ),
    "fp16_cast_toward_zero": (
        "formats/test_cast_rounding.py",
        "rounds_to_nearest_even_everywhere and fp16",
        ("*rounds_to_nearest_even_everywhere[[]cpu-fp16]",),
    ),
    # the same cast against the unit-roundoff bound: the script casts the failing example the same way
    "fp16_cast_toward_zero/relative_error": (
        "formats/test_cast_rounding.py",
        "relative_error and fp16",
        ("*relative_error_is_at_most_unit_roundoff*[[]cpu-fp16]",),
    ),
    # autocast's dispatcher kernels: the golden policy table and the hand-cast equality
    "layer_norm_autocast_lowp": (
        "autocast/test_op_policy.py",
        "golden_table and bf16",
        ("*golden_table[[]cpu-bf16]",),
    ),
    "mm_autocast_one_ulp_off": (
        "autocast/test_op_policy.py",
        "run_by_hand and bf16",
        ("*run_by_hand*[[]cpu-bf16]",),
    ),
    # the same scaler against the stored golden trace: the script holds the trace to the scaler's rule
    "scaler_never_backs_off/golden_trace": (
        "scaler/test_overflow_in_training.py",
        "golden_trace and not Sharded",
        ("*matches_the_golden_trace[[]GradScaler-cpu]",),
    ),
    "scaler_never_backs_off/state_machine": (
        "scaler/test_gradscaler_state_machine.py",
        "reference_state_machine and not Sharded",
        ("*follows_the_reference_state_machine[[]GradScaler-cpu]",),
    ),
    "mm_autocast_in_fp32": (
        "autocast/test_upstream_lists.py",
        "agrees_with_pytorchs_own_lists and bf16",
        ("*agrees_with_pytorchs_own_lists[[]cpu-bf16]",),
    ),
    "mm_autocast_casting_float64": (
        "autocast/test_op_policy.py",
        "never_cast and bf16",
        ("*never_cast[[]cpu-bf16]",),
    ),
    "linear_autocast_uncached": (
        "autocast/test_op_policy.py",
        "cast_once and bf16",
        ("*cast_once*[[]cpu-bf16]",),
    ),
    "gelu_autocast_registered": (
        "autocast/test_op_policy.py",
        "registered_autocast_ops_match",
        ("*registered_autocast_ops_match*[[]cpu]",),
    ),
    "fp8_overflow_to_nan": (
        "formats/test_fp8_casts.py",
        "matches_this_releases_baseline",
        ("*fp8_overflow_inf_and_nan_behaviour_matches_this_releases_baseline[[]cpu]",),
    ),
    "fp8_nan_to_zero": (
        "formats/test_fp8_casts.py",
        "nan_input_gives_nan and e5m2",
        ("*nan_input_gives_nan[[]cpu-e5m2]",),
    ),
    "finfo_fp16_max_halved": (
        "formats/test_format_limits.py",
        "match_torch_finfo and fp16",
        ("*match_torch_finfo[[]fp16]",),
    ),
    # a kernel regression in one op of the tiny LM: the script runs that op alone on its inputs
    # a parity failure no single op explains: the script trains the whole run (the built-in MLP)
    "scaler_scaling_a_quarter_high": (
        "training/test_loss_parity.py",
        "matches_fp32 and mlp-fp16+scaler and not accum4 and not clip and not small",
        ("*matches_fp32_well_inside_the_seed_spread[[]cpu-mlp-fp16+scaler]",),
    ),
    # a run that parts from itself: the script trains the built-in MLP twice in one interpreter
    "sgd_step_drifting_between_runs": (
        "training/test_loss_parity.py",
        "bitwise_identical and mlp-fp32",
        ("*bitwise_identical_losses[[]cpu-mlp-fp32]",),
    ),
    # the memory checks: the script counts the tiny LM's bytes as the check does, exactly
    "autocast_disabled": (
        "memory/test_memory.py",
        "saves_fewer and bf16",
        ("*saves_fewer_activation_bytes_for_backward[[]cpu-bf16]",),
    ),
    "adamw_amsgrad_by_default": (
        "memory/test_memory.py",
        "model_state_bytes and autocast",
        ("*model_state_bytes_match_the_analytic_model[[]*autocast*]",),
    ),
    # the source text's claims: the row that reads torch keeps the torch expression
    "finfo_fp16_max_halved/claims": (
        "formats/test_source_claims.py",
        "fp16_range",
        ("*claim_holds[[]fp16_range]",),
    ),
    "lossy_gelu": (
        "training/test_op_fingerprints.py",
        "within_its_budget and tiny_lm-bf16",
        ("*within_its_budget*[[]cpu-tiny_lm-bf16]",),
    ),
}
# the AMP patterns: each pattern's script runs the documented pattern on the faulty torch
CONTROLS.update(
    {
        "patterns_recompute_outside_autocast": (
            "patterns/test_checkpointing.py",
            "checkpointed_gradients_equal and bf16-non_reentrant",
            ("*checkpointed_gradients_equal_the_unchecked_models_bit_for_bit[[]cpu-bf16-non_reentrant]",),
        ),
        "patterns_custom_fwd_ignoring_cast_inputs": (
            "patterns/test_custom_functions.py",
            "bf16-fp32-ctx",
            ("*decorators_promise[[]cpu-bf16-fp32-ctx]",),
        ),
        "patterns_scaler_state_not_restored": (
            "patterns/test_resume.py",
            "fp16",
            ("*continues_bit_for_bit_as_the_uninterrupted_one[[]cpu-fp16]",),
        ),
        # the scaler's recorded hazards: the finding's script exits 1 where it no longer holds
        "scaler_never_backs_off/hazards": (
            "scaler/test_overflow_in_training.py",
            "no_floor and not Sharded",
            ("*scale_has_no_floor_and_a_zero_scale_corrupts_parameters[[]GradScaler-cpu]",),
        ),
        "patterns_update_per_optimizer": (
            "patterns/test_multiple_optimizers.py",
            "inf_in_model_0",
            ("*backs_off_once[[]cpu-inf_in_model_0]",),
        ),
    }
)
#: controls of a third-party scaler -> the package they need (skipped without it, saying so)
THIRD_PARTY = {"megatron_scaler_never_backs_off": "megatron-core", "deepspeed_scaler_never_backs_off": "deepspeed"}
#: how the suite's run gets each fault: a patched attribute -> its factory
PATCHES = {
    **{name: {target: factory} for name, (target, factory) in stacks.STACKS.items()},
    "lossy_gelu": {
        "harness.domains.engines.training.diagnosis.record_step": "faults.training.recording_under_lossy_gelu"
    },
    # the kernel in force while the policy table is probed (the captured calls replay into it)
    **{
        k: {"harness.domains.engines.ops.probe.probe": f"faults.stacks.with_kernel({k!r})"}
        for k in ("layer_norm_autocast_lowp", "mm_autocast_one_ulp_off", "mm_autocast_in_fp32")
    },
}
#: controls whose failed test writes more than one script: a block-scaled linear's three products;
#: the overscaling GradScaler's parity (the whole run) and AMP lane (its judged steps); the zero-scale hazard's two findings
SCRIPTS = {"fp8_mx_scale_binade_high": 3, "scaler_scaling_a_quarter_high": 2, "scaler_never_backs_off/hazards": 2}
#: suite file -> the folder of its golden tables (copied into the control's run)
GOLDEN = {
    "scaler/test_overflow_in_training.py": "scaler",
    "autocast/test_op_policy.py": "autocast",
    "formats/test_fp8_casts.py": "formats",
    "fp8/test_fp8_formats.py": "fp8",
}
#: faulty kernels in force for the whole test (the check's own calls)
KERNEL_FAULTS = (
    "mm_autocast_casting_float64",
    "linear_autocast_uncached",
    "gelu_autocast_registered",
    "addmm_activation_autocast_uncast",
)


def _exit_statuses(runs: list[dict[Path, list[str]]]) -> list[tuple[dict[str, int], str]]:
    """Each run's scripts' exit statuses, each script on the faulty stacks named for it ([]: the
    clean one); the runs' interpreters side by side."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-I", "-c", faulty_driver({str(p): f for p, f in run.items()}), *map(str, run)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in runs
    ]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        line = next((x for x in stdout.splitlines() if x.startswith("CODES ")), None)
        assert line is not None, stdout[-3000:] + stderr[-3000:]
        results.append((json.loads(line.removeprefix("CODES ")), stdout + stderr))
    return results


@pytest.fixture(scope="module")
def scripts_of_failed_checks() -> dict[str, list[Path]]:
    """Each control's scripts, written by the test that ran its suite (module scope: the fresh
    interpreters that run them, a few seconds each, are shared)."""
    return {}


@pytest.mark.standalone_scripts  # writes what the next test runs
@pytest.mark.parametrize("fault", list(CONTROLS))
def test_a_failed_check_writes_a_standalone_script(
    fault, pytester, suite_copy, tmp_path_factory, capsys, scripts_of_failed_checks
):
    if fault.startswith("fp8") and not HAS_TORCHAO:
        pytest.skip("the fp8 control needs torchao (pip install amp-harness[fp8])")
    package = THIRD_PARTY.get(fault)
    if package is not None and importlib.util.find_spec(package.replace("-", ".").split(".")[0]) is None:
        scripts_of_failed_checks[fault] = []  # nothing to run: the suite's check skips here too
        pytest.skip(f"{package} is not installed: the opt-in environment `tox -e thirdparty` installs it")
    missing = kernels.scaled_mm_missing("cpu")
    if fault == "fp8_scaled_mm_without_scale_b" and missing is not None:
        scripts_of_failed_checks[fault] = []  # nothing to run: the suite's check skips here too
        pytest.skip(f"the scaled-product check skips on this kernel set: {missing}")
    suite, selection, caught = CONTROLS[fault]
    suite_copy(suite)
    if suite in GOLDEN:  # the project's golden tables, stored from a run of this release
        golden = BASELINES / GOLDEN[suite] / f"torch-{'.'.join(torch.__version__.split('.')[:2])}"
        if not golden.is_dir():
            pytest.skip(f"no golden policy table for torch {torch.__version__} in {BASELINES}")
        shutil.copytree(golden, pytester.path / "baselines" / GOLDEN[suite] / golden.name)
    imports = (
        "faults.stacks",
        "harness.domains.engines.training.diagnosis",
        "harness.domains.engines.ops.probe",
        "torch",
    )
    if package is not None:  # the patched scaler's module, imported here first: on import it warns
        module = stacks.STACKS[fault][0].rsplit(".", 2)[0]  # about missing CUDA extensions
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
        imports += (module,)
    if fault.startswith("fp8"):
        imports += (
            "torchao.float8.float8_utils",
            "torchao.float8.float8_scaling_utils",
            "torchao.prototype.mx_formats.mx_tensor",
            "torchao.optim.quant_utils",
            "torchao.prototype.mx_formats.kernels",
            "torchao.prototype.mx_formats.nvfp4_tensor",
        )
    inject(
        pytester,
        "",
        patches=PATCHES.get(fault, PATCHES.get(fault.split("/")[0], {})),
        imports=imports,
        kernels=(fault,) if fault in KERNEL_FAULTS else (),
    )
    run = run_inner(pytester, "-k", selection, f"--amp-report-dir={pytester.path / 'out'}")
    assert_caught(run, *caught)

    out = tmp_path_factory.mktemp(f"repro-{fault.replace('/', '-')}")
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(out)]) == 0
    written = sorted(out.glob("*.py"))
    assert len(written) == SCRIPTS.get(fault, 1), capsys.readouterr()
    text = written[0].read_text(encoding="utf-8")
    tree = ast.parse(text)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    stdlib = {"sys", "math", "fractions", "struct", "dataclasses", "pathlib", "inspect", "types", "statistics"}
    stdlib |= {"collections", "typing"}  # the script files' annotations
    stdlib |= {"functools", "io", "copy"}  # the AMP patterns' scripts
    assert imported <= stdlib | {"torch", "torchao", "megatron", "deepspeed"}, imported  # and the library concerned
    assert "# Produced on: torch" in text and "#   pytest 'suites/" in text  # provenance and the rerun command
    for script in written:  # every name each script reads is bound in it: it runs where it lies
        assert not unbound_names(script.read_text(encoding="utf-8")), (script.name, unbound_names(script.read_text()))
    scripts_of_failed_checks[fault] = written


@pytest.mark.standalone_scripts
@pytest.mark.amp_thorough  # two interpreters run every script, each a whole training run
def test_each_script_exits_1_on_its_faulty_stack_and_0_on_the_clean_one(scripts_of_failed_checks):
    """Run after the tests that write the scripts (file order): one interpreter runs each script
    on its own fault (installed for that script, then removed: faults replacing the same thing
    take turns), another runs them all on the clean stack."""
    if len(scripts_of_failed_checks) < len(CONTROLS) - ("fp8_scale_doubled" not in scripts_of_failed_checks):
        pytest.skip("the scripts are written by test_a_failed_check_writes_a_standalone_script: run it first")
    faulty_stacks = {p: [control.split("/")[0]] for control, paths in scripts_of_failed_checks.items() for p in paths}
    (faulty, said_faulty), (clean, said_clean) = _exit_statuses([faulty_stacks, {p: [] for p in faulty_stacks}])
    assert all(faulty[str(p)] == 1 for p in faulty_stacks), (faulty, said_faulty)
    assert said_faulty.count("measured") >= len(faulty_stacks) and "allowed" in said_faulty
    assert all(clean[str(p)] == 0 for p in faulty_stacks), (clean, said_clean)


#: compiled fault -> (suite file, -k selection, the failed test, what its script prints)
COMPILED_CONTROLS = {
    "compile_rounding_softmax": (
        "compiled/test_compiled_numerics.py",
        "eager_error_plus and bf16",
        "*eager_error_plus_the_rounding_budget[[]cpu-bf16]",
        "forward.softmax",
    ),
    "compile_softmax_in_float32": (
        "compiled/test_compiled_policy.py",
        "eager_dtypes and bf16",
        "*has_eager_dtypes_at_every_stage_and_gradient[[]cpu-bf16]",
        "forward.softmax: compiled torch.float32, eager torch.bfloat16",
    ),
    "compile_region_in_low_precision": (
        "compiled/test_compiled_policy.py",
        "stays_fp32_in_the_compiled_forward and bf16",
        "*stays_fp32_in_the_compiled_forward[[]cpu-bf16]",
        "forward.out: compiled torch.bfloat16, eager torch.float32",
    ),
}


@pytest.mark.amp_thorough  # compiles the probe block three times: in the suite, then in each interpreter
@pytest.mark.parametrize("fault", list(COMPILED_CONTROLS))
def test_a_failed_compiled_checks_script_exits_1_on_the_faulty_compiler_and_0_on_inductor(
    fault, pytester, suite_copy, tmp_path, capsys
):
    suite, selection, caught, said = COMPILED_CONTROLS[fault]
    suite_copy(suite)
    inject(pytester, "", patches=PATCHES[fault], imports=("faults.stacks", "torch"))
    run = run_inner(pytester, "-k", selection, f"--amp-report-dir={pytester.path / 'out'}")
    assert_caught(run, caught)
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(tmp_path)]) == 0, capsys.readouterr()
    scripts = sorted(tmp_path.glob("*.py"))
    assert len(scripts) == 1 and (tmp_path / f"{scripts[0].stem}.pt").is_file(), (
        capsys.readouterr()
    )  # weights beside it
    (faulty, said_faulty), (clean, said_clean) = _exit_statuses(
        [{p: [fault] for p in scripts}, {p: [] for p in scripts}]
    )
    assert faulty[str(scripts[0])] == 1 and said in said_faulty, said_faulty
    assert clean[str(scripts[0])] == 0, said_clean


@pytest.mark.amp_thorough  # three ops compiled in the suite, then in each interpreter: about 20 s
def test_a_failed_compiled_catalogue_sweep_writes_a_script_of_the_ops_that_differ(
    pytester, suite_copy, tmp_path, capsys
):
    suite_copy("compiled/test_compiled_policy.py")
    inject(pytester, "", patches=PATCHES["compile_outputs_in_float32"], imports=("faults.stacks", "torch"))
    # the sample replaces the catalogue the test module itself holds (a module imported by an earlier
    # inner run may be another copy than the one sys.modules has now)
    (pytester.path / "conftest.py").write_text(
        "import faults.compiled, pytest\n\n\n@pytest.fixture(autouse=True)\ndef catalogue_sample(request, monkeypatch):\n"
        "    held = getattr(request.module, 'catalogue', None)\n"
        "    if held is not None:\n"
        "        monkeypatch.setattr(held, 'CATALOGUE', faults.compiled.catalogue_sample(held.CATALOGUE))\n",
        encoding="utf-8",
    )
    sweep = "test_every_catalogue_op_keeps_its_eager_dtype_when_compiled[cpu-bf16]"
    run = run_inner(pytester, "-k", sweep, "--amp-tier=thorough", f"--amp-report-dir={pytester.path / 'out'}")
    assert_caught(run, f"*{sweep.replace('[', '[[]')}")
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(tmp_path)]) == 0, capsys.readouterr()
    scripts = sorted(tmp_path.glob("*.py"))
    assert len(scripts) == 1, capsys.readouterr()
    (faulty, said_faulty), (clean, said_clean) = _exit_statuses(
        [{p: ["compile_outputs_in_float32"] for p in scripts}, {p: [] for p in scripts}]
    )
    assert faulty[str(scripts[0])] == 1, said_faulty
    for op in ("torch.mm", "F.linear"):  # the two low-precision ops; layer_norm stays float32 either way
        assert f"{op}: compiled float32, eager bfloat16   <- differs" in said_faulty, said_faulty
    assert "F.layer_norm" not in said_faulty
    assert clean[str(scripts[0])] == 0, said_clean


@pytest.mark.amp_thorough  # the MLP trained compiled in the suite, then twice per interpreter: about 90 s
def test_a_failed_compiled_training_check_writes_the_whole_run_as_a_script(pytester, suite_copy, tmp_path, capsys):
    suite_copy("compiled/test_compiled_training.py")
    inject(pytester, "", patches=PATCHES["compile_output_scaled_off"], imports=("faults.stacks", "torch"))
    check = "test_compiled_training_matches_eager_amp_and_fp32_within_the_seed_spread[cpu-mlp-bf16]"
    run = run_inner(pytester, "-k", "mlp-bf16", f"--amp-report-dir={pytester.path / 'out'}")
    assert_caught(run, f"*{check.replace('[', '[[]')}")
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(tmp_path)]) == 0, capsys.readouterr()
    scripts = sorted(tmp_path.glob("*.py"))
    # both failed claims (against eager, against fp32) keep the same run: one script each
    assert scripts and all((tmp_path / f"{p.stem}.pt").is_file() for p in scripts), capsys.readouterr()
    (faulty, said_faulty), (clean, said_clean) = _exit_statuses(
        [{scripts[0]: ["compile_output_scaled_off"]}, {scripts[0]: []}]
    )
    assert faulty[str(scripts[0])] == 1 and "compiled" in said_faulty, said_faulty
    assert clean[str(scripts[0])] == 0, said_clean


@pytest.mark.amp_thorough  # the MLP's band and curves in the inner run, the script twice: about 6 s; by
# default the parity control proves the same whole-run trainer, and a drifted curve fails the check
def test_a_drifted_golden_curve_writes_the_run_as_a_script(pytester, suite_copy, tmp_path, capsys):
    """GradScaler scaling the loss a quarter high moves the MLP's fp16 + GradScaler curve off its
    golden curve; the script trains that run and holds its losses to the stored curve by the
    lane's rule: exit 1 with the fault, 0 without."""
    suite_copy("training/test_golden_curves.py")
    shutil.copytree(BASELINES / "training", pytester.path / "baselines" / "training")
    inject(pytester, "", patches=PATCHES["scaler_scaling_a_quarter_high"], imports=("faults.stacks", "torch"))
    check = "test_loss_curves_match_the_golden_curves_of_this_profile[cpu-mlp]"
    run = run_inner(
        pytester, "-k", "golden_curves_of_this_profile and mlp", f"--amp-report-dir={pytester.path / 'out'}"
    )
    assert_caught(run, f"*{check.replace('[', '[[]')}")
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(tmp_path)]) == 0, capsys.readouterr()
    (script,) = tmp_path.glob("*.py")
    assert "under fp16+scaler: per-step training losses against its golden curve" in script.read_text(encoding="utf-8")
    (faulty, said_faulty), (clean, said_clean) = _exit_statuses(
        [{script: ["scaler_scaling_a_quarter_high"]}, {script: []}]
    )
    assert faulty[str(script)] == 1, said_faulty
    assert clean[str(script)] == 0, said_clean


@pytest.mark.amp_thorough  # nine CNN runs in the inner run, then twice nine in the script: about 25 s; by
# default the same fault fails the precision lane (tests/test_training_suite_can_fail.py)
def test_a_failed_precision_lane_writes_its_runs_as_a_script(pytester, suite_copy, tmp_path, capsys):
    """AdamW keeping 16 of fp32's 24 significand bits: the CNN's fp32 run leaves float64's
    rounding distance; the script trains fp32, bf16 and float64 for each data order and judges the
    median ratio: exit 1 with the fault, 0 without."""
    suite_copy("training/test_golden_curves.py")
    fault = "adamw_losing_fp32_update_precision"
    inject(pytester, "", patches=PATCHES[fault], imports=("faults.stacks", "faults.training", "torch"))
    check = "test_fp32_stays_within_rounding_distance_of_an_fp64_run[cpu-cnn_bn]"
    run = run_inner(pytester, "-k", "fp64_run and cnn_bn", f"--amp-report-dir={pytester.path / 'out'}")
    assert_caught(run, f"*{check.replace('[', '[[]')}")
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(tmp_path)]) == 0, capsys.readouterr()
    (script,) = tmp_path.glob("*.py")
    (faulty, said_faulty), (clean, said_clean) = _exit_statuses([{script: [fault]}, {script: []}])
    assert faulty[str(script)] == 1 and "data order 2" in said_faulty, said_faulty
    assert clean[str(script)] == 0, said_clean


def _repro_of_a_row_without_script(tmp_path, capsys, tags=None) -> str:
    """``repro --report`` of a report whose one failed row recorded no script: its output (exit 3)."""
    from harness.storage import report as rp

    row = rp.make_row(
        run_id="r1",
        nodeid="suites/x/test_y.py::test_z",
        suite="x",
        check="test_z",
        metric="m",
        value=1.0,
        outcome="fail",
        tags=tags,
    )
    rp.write(tmp_path, "r1", [row.as_dict()], {"fingerprint": {"torch_version": "2.13.0"}})
    assert main(["repro", "--report", str(tmp_path), "-o", str(tmp_path / "s")]) == 3
    return capsys.readouterr().out


def test_a_failed_check_without_a_recorded_reproduction_is_named_with_its_rerun_command(tmp_path, capsys):
    out = _repro_of_a_row_without_script(tmp_path, capsys)
    assert "suites/x/test_y.py::test_z :: m: no standalone reproduction recorded" in out
    assert "pytest 'suites/x/test_y.py::test_z'" in out


def test_a_check_that_cannot_keep_a_script_says_why(tmp_path, capsys):
    """A check whose subject is code a script cannot hold (your recipe) records why it keeps none;
    ``repro`` prints that reason, not "not yet"."""
    out = _repro_of_a_row_without_script(
        tmp_path, capsys, {"no_script": "the recipe under test is code a script cannot hold"}
    )
    assert "m: no standalone reproduction recorded (the recipe under test is code a script cannot hold)" in out


def test_one_check_failing_at_two_dtypes_keeps_two_scripts(tmp_path, capsys):
    """The metric names a script; where bf16 and fp16 of one check both failed, the dtype tells
    their scripts apart (one would otherwise overwrite the other)."""
    from harness.domains.repro import FailureRepro
    from harness.storage import report as rp

    rows = [
        rp.make_row(
            run_id="r1",
            nodeid=f"suites/x/test_y.py::test_z[cpu-{dtype}]",
            suite="x",
            check="test_z",
            metric="m.ratio",
            value=1.0,
            outcome="fail",
            dtype=dtype,
            tags={"repro": FailureRepro("x", "what", f"measured = 1  # {dtype}\nallowed = 0", "none").spec(None)},
        ).as_dict()
        for dtype in ("bfloat16", "float16")
    ]
    rp.write(tmp_path, "r1", rows, {"fingerprint": {"torch_version": "2.13.0"}})
    assert main(["repro", "--report", str(tmp_path), "-o", str(tmp_path / "s")]) == 0
    written = sorted(p.name for p in (tmp_path / "s").glob("*.py"))
    assert written == ["m_ratio.py", "m_ratio_float16.py"], written
    assert "# float16" in (tmp_path / "s" / "m_ratio_float16.py").read_text(encoding="utf-8")


def test_a_report_without_failures_or_a_missing_report_says_so(tmp_path, capsys):
    from harness.storage import report as rp

    row = rp.make_row(run_id="r1", nodeid="n", suite="x", check="c", metric="m", value=1.0, outcome="pass")
    rp.write(tmp_path, "r1", [row.as_dict()], {})
    assert main(["repro", "--report", str(tmp_path)]) == 4
    assert "no failed check in the run" in capsys.readouterr().err
    assert main(["repro", "--report", str(tmp_path / "nope")]) == 2  # a usage error
    assert "no such run report directory" in capsys.readouterr().err
    assert main(["repro", "--check", "x"]) == 2
    assert "give the report with --report" in capsys.readouterr().err


def test_an_attachment_outside_its_folder_is_refused(tmp_path):
    from harness.storage import report as rp

    with pytest.raises(ValueError, match="must lie in attachments/"):
        rp.write(tmp_path, "r1", [], {}, {"../escape.pt": b"x"})
    assert not (tmp_path / "r1").exists() and not (tmp_path / "escape.pt").exists()


def test_a_failed_known_issue_check_writes_the_issues_own_script(tmp_path, capsys):
    """A registry check fails when its issue occurs where the registry does not list it, or appears
    fixed where it does: ``repro`` writes the registered reproduction (proven to exit 1 on this
    stack and 0 with its fix by ``test_reproductions.py``) and says which way it failed."""
    from harness.domains import known_issues as R
    from harness.storage import report as rp

    def row(issue: str, present: bool) -> dict[str, object]:
        return rp.make_row(
            run_id="r1",
            nodeid=f"suites/scaler/test_overflow_in_training.py::test_known_issue_status_matches_the_registry[{issue}]",
            suite="scaler",
            check="test_known_issue_status_matches_the_registry",
            metric=f"known_issue.{issue}",
            value=present,
            outcome="fail",
        ).as_dict()

    rows = [row("update-int-new-scale", False), row("sharded-cpu-growth-uncapped", True), row("no-such-issue", True)]
    rp.write(tmp_path, "r1", rows, {"fingerprint": {"torch_version": "2.13.0"}})
    assert main(["repro", "--report", str(tmp_path), "-o", str(tmp_path / "s")]) == 3  # the unknown id has none
    out = capsys.readouterr().out
    assert "known issue update-int-new-scale appears fixed here, unlike its registry: the script exits 0" in out
    assert "known issue sharded-cpu-growth-uncapped occurs here, unlike its registry: the script exits 1" in out
    assert "known_issue.no-such-issue: no standalone reproduction recorded" in out
    script = (tmp_path / "s" / "update_int_new_scale.py").read_text()
    assert script.endswith(R.REPRODUCTIONS["update-int-new-scale"].body)
    assert "::test_known_issue_status_matches_the_registry[update-int-new-scale]" in script  # what failed
    ast.parse(script)


@pytest.mark.amp_thorough  # two Inductor compiles, each in an interpreter of its own: about 15 s
def test_a_scalar_cases_script_exits_1_where_inductor_leaves_the_scalar_unrounded_and_0_where_it_rounds(tmp_path):
    """The script a failed scalar case writes, on this stack's real Inductor: a case of a kind the
    registry lists for this release (fmod: open) exits 1, one of a kind fixed here (comparisons,
    from 2.12) exits 0; the registry decides which, so the control holds on any release."""
    from harness.domains.compiled import scalars
    from harness.domains.compiled.known_issues import KNOWN_ISSUES
    from harness.domains.compiled.repro import scalar_repro
    from harness.domains.repro import render

    expected = {}
    for name, cases, issue in (("fmod", ["fmod"], scalars.FMOD_REMAINDER), ("cmp", ["gt", "eq"], scalars.COMPARISON)):
        repro = scalar_repro(torch.device("cpu"), torch.bfloat16, "inductor", cases)
        assert repro is not None
        path = tmp_path / f"scalars_{name}.py"
        path.write_text(render(repro.spec(None), {}, ["the harness's own test"], None), encoding="utf-8")
        expected[str(path)] = 1 if KNOWN_ISSUES[issue].listed(torch.__version__, "cpu") else 0
    (statuses, said), *_ = _exit_statuses([{Path(p): [] for p in expected}])
    assert {p: statuses[p] for p in expected} == expected, said
