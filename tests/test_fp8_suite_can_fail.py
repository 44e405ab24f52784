"""Negative controls: the fp8 suite, run on deliberately wrong fp8 code, must fail.

The real suite files are copied into a scratch directory; a conftest swaps in a broken cast or
scaling adapter (``faults/fp8.py``), or patches torchao where the suite uses it directly; each test
asserts exactly which checks catch the fault.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys

import pytest
from faults.fp8 import NO_FP8_KERNEL
from helpers import TESTS, assert_caught, assert_clean, fresh_driver, inject, run_inner
from scaled_controls import FIXTURES, failed_rows, run_scaled

from harness.apps.cli import main
from harness.platform import kernels

pytest.importorskip("torchao", reason="the fp8 suite's controls need torchao (pip install amp-harness[fp8])")

SCALING = "fp8/test_fp8_scaling.py"
MATMUL = "fp8/test_scaled_matmul.py"
FORMATS = "fp8/test_fp8_formats.py"
TRAINING = "fp8/test_float8_training.py"

EXACT = "test_scales_and_casts_equal_the_exact_reference"
SATURATION = "test_a_correctly_scaled_tensor_never_relies_on_saturation"
SCALED_MM = "test_scaled_mm_is_within_its_error_budget_and_sqnr_floor"

#: broken scaling adapter -> the checks (fnmatch patterns of test ids) that must fail; nothing else may
MUST_CATCH: dict[str, tuple[str, ...]] = {
    # a per-column amax still bounds every element: no saturation, but the scales and the rowwise
    # product's scale shapes are wrong
    "WrongAxis": (f"*::{EXACT}[[]cpu-*wise-e4m3-pow2]", f"*::{SCALED_MM}[[]cpu-rowwise-*]"),
    "AmaxIgnoresNegatives": (f"*::{EXACT}[[]*]", f"*::{SATURATION}[[]*]", f"*::{SCALED_MM}[[]*]"),
    "E5m2ForE4m3": (f"*::{EXACT}[[]cpu-*e4m3*]", f"*::{SATURATION}[[]cpu-*e4m3*]", f"*::{SCALED_MM}[[]*]"),
    "ScaleOffByTwo": (f"*::{EXACT}[[]*]", f"*::{SATURATION}[[]*]", f"*::{SCALED_MM}[[]*]"),
    "StaleAmax": (f"*::{EXACT}[[]*]", f"*::{SATURATION}[[]*]", f"*::{SCALED_MM}[[]*]"),
    "RoundsTowardZero": (f"*::{EXACT}[[]*]", f"*::{SCALED_MM}[[]*]"),
}

#: a kernel set without an fp8 matmul (the Zen 4 and AVX2 sets on an AMX CPU): every _scaled_mm raises
NO_KERNEL = {"torch._scaled_mm": "faults.fp8.scaled_mm_without_kernel"}


@pytest.mark.amp_thorough  # the suite itself runs on torchao's scaling in every `pytest suites/`
def test_the_scaling_checks_pass_on_torchaos_own_scaling(pytester, suite_copy):
    assert_clean(run_scaled(pytester, suite_copy, SCALING, MATMUL), at_least=20)


@pytest.mark.amp_thorough  # the adapter path itself is exercised by every broken adapter below
def test_a_users_own_correct_scaling_in_plain_torch_passes(pytester, suite_copy):
    """The adapter path users take: scaling code of their own, without torchao, judged by the suite."""
    run = run_scaled(
        pytester, suite_copy, SCALING, scaling="faults.fp8.PlainTorchScaling()", args=("-k", "exact_reference")
    )
    assert_clean(run, at_least=5)


#: The default tier's broken scaling: it fails every scaling and scaled-matmul check (each run also
#: shows that no other check fails); the others are in the thorough tier, ~4 s each.
DEFAULT_FAULTS = ("ScaleOffByTwo",)
#: the checks a scaling fault can reach (the registry and MX checks have controls of their own below)
SCALING_CHECKS = ("-k", "exact_reference or saturation or scaled_mm")


def test_the_default_faults_make_every_scaling_check_fail():
    caught = {p.split("::")[1].split("[")[0] for f in DEFAULT_FAULTS for p in MUST_CATCH[f]}
    assert caught == {EXACT, SATURATION, SCALED_MM}


@pytest.mark.parametrize(
    "fault", [f if f in DEFAULT_FAULTS else pytest.param(f, marks=pytest.mark.amp_thorough) for f in sorted(MUST_CATCH)]
)
def test_broken_fp8_scaling_fails_exactly_the_checks_that_guard_against_it(pytester, suite_copy, fault):
    run = run_scaled(
        pytester, suite_copy, SCALING, MATMUL, scaling=f"faults.fp8.BROKEN_SCALING[{fault!r}]()", args=SCALING_CHECKS
    )
    assert_caught(run, *_on_this_kernel_set(run, MUST_CATCH[fault]))


def _on_this_kernel_set(run, patterns: tuple[str, ...]) -> tuple[str, ...]:
    """``patterns`` as this kernel set can show them: where ``_scaled_mm`` has no fp8 kernel (the Zen 4
    and AVX2 sets on an AMX CPU) its checks skip naming the kernel set, and cannot catch anything."""
    missing = kernels.scaled_mm_missing("cpu")
    if missing is None:
        return patterns
    skipped = [t for t in run.skipped if SCALED_MM in t]
    assert skipped, f"{SCALED_MM} neither ran nor skipped where the kernel is missing ({missing})\n{run.text()}"
    return tuple(p for p in patterns if SCALED_MM not in p)


def test_broken_decodes_and_e8m0_and_fp4_casts_fail_their_format_checks(pytester, suite_copy):
    """Subnormal codes decoded as zero, an e8m0 cast that truncates, an fp4 cast that clears its
    mantissa bit: each fails the check of its own (one run, three faults that touch different checks)."""
    suite_copy(FORMATS, conftest=False)
    fixtures = {
        **FIXTURES,
        "fp8_scaling_under_test": "faults.fp8.TorchaoScaling()",
        "fp8_decode_under_test": "faults.fp8.decode_flushing_subnormals",
        "e8m0_cast_under_test": "faults.fp8.e8m0_rounding_down",
    }
    patches = {"torchao.prototype.mx_formats.kernels.f32_to_f4_unpacked": "faults.fp8.fp4_truncating"}
    inject(pytester, "fp8", fixtures=fixtures, patches=patches, imports=("torchao.prototype.mx_formats.kernels",))
    run = run_inner(pytester, "-k", "decodes or e8m0_rounds or fp4")
    assert_caught(
        run,
        "*::test_every_code_decodes_to_the_value_its_bit_layout_defines[[]cpu-float8_e4m3fn]",
        "*::test_every_code_decodes_to_the_value_its_bit_layout_defines[[]cpu-float8_e5m2]",
        "*::test_fp32_to_e8m0_rounds_to_the_nearest_power_of_two[[]cpu]",
        "*::test_fp4_e2m1_codes_and_rounding_match_the_reference[[]cpu]",
    )
    run.stdout.fnmatch_lines(
        ["*float8_e4m3fn.decode_mismatches: FAILED*", "*code 0x01: expected 0.001953125, got 0.0*"]
    )


@pytest.mark.amp_thorough  # a fresh copy of the formats file on a faulty 'compiler'; the real compile is thorough on the CPU too
def test_a_compiler_whose_fp8_casts_truncate_fails_the_compiled_cast_check(pytester, suite_copy):
    run = run_scaled(
        pytester,
        suite_copy,
        FORMATS,
        args=("-k", "compiled", "--amp-tier=thorough"),
        **{"harness.domains.engines.compiler.compiling.compile_fn": "faults.fp8.compile_truncating"},
    )
    assert_caught(run, "*::test_compiled_fp8_casts_give_the_eager_bits[[]cpu-*]")


def test_a_torchao_recipe_that_changed_an_operands_format_fails_the_recipe_check(pytester, suite_copy):
    run = run_scaled(
        pytester,
        suite_copy,
        SCALING,
        args=("-k", "recipe_casts"),
        **{"torchao.float8.Float8LinearConfig.from_recipe_name": "faults.fp8.rowwise_grad_output_e5m2"},
    )
    assert_caught(run, "*::test_torchaos_recipe_casts_each_operand_as_its_specification_says[[]rowwise]")
    run.stdout.fnmatch_lines(["*grad_input/grad_output: spec e4m3fn, one scale per axis -1, power of 2, torchao e5m2*"])


@pytest.mark.amp_thorough  # the outlier check and every recipe's training run again on the fault: ~10 s
def test_a_doubled_scale_fails_the_outlier_check_and_every_recipes_training(pytester, suite_copy):
    """Measured: tensorwise training misses its allowance by 37x (docs/fp8.md)."""
    run = run_scaled(
        pytester,
        suite_copy,
        TRAINING,
        args=("-k", "mlp_training or outlier", "--amp-tier=thorough"),
        **{"torchao.float8.float8_scaling_utils.tensor_to_scale": "faults.fp8.doubled_scale"},
    )
    assert_caught(
        run,
        "*::test_float8_mlp_training_stays_within_the_fp32_seed_band[[]cpu-*]",
        "*::test_an_activation_outlier_mid_run_leaves_no_lasting_damage[[]cpu-*]",
    )
    run.stdout.fnmatch_lines(
        [
            "*mlp.float8_tensorwise.worst_diff_over_allowance: FAILED: * (allowance 1)*",
            "*mlp / float8 tensorwise: at step * the evaluation loss differs from fp32 by *, allowance *; reproduce: seed 0*",
        ],
        consecutive=False,
    )


@pytest.mark.parametrize("kernel", ["present", "missing"])
def test_a_doubled_scale_inside_float8_linear_fails_its_budget(pytester, suite_copy, kernel):
    """torchao's own tensor_to_scale times two: Float8Linear saturates its largest values and its
    matmuls leave their budgets (training and the outlier check: the thorough-tier control below).
    Without an fp8 kernel the emulated matmul judges the same casts, and fails the same way."""
    run = run_scaled(
        pytester,
        suite_copy,
        MATMUL,
        TRAINING,
        args=("-k", "tensorwise and float8_linear"),
        **(NO_KERNEL if kernel == "missing" else {}),
        **{"torchao.float8.float8_scaling_utils.tensor_to_scale": "faults.fp8.doubled_scale"},
    )
    assert_caught(run, "*::test_float8_linear_output_and_gradients_are_within_budget[[]cpu-tensorwise]")


def test_a_torchao_that_fixed_a_registered_finding_fails_as_appears_fixed(pytester, suite_copy):
    run = run_scaled(
        pytester,
        suite_copy,
        SCALING,
        args=("-k", "registered"),
        **{"torchao.float8.float8_utils._round_scale_down_to_power_of_2": "faults.fp8.exact_pow2"},
    )
    assert_caught(run, "*::test_registered_fp8_findings_match_what_this_torchao_does[[]torchao-pow2-scale-rounds-up]")
    run.stdout.fnmatch_lines(
        ["*appears fixed in torchao*set fixed=*KNOWN_ISSUES in harness/domains/fp8/known_issues.py*"]
    )


@pytest.mark.amp_thorough  # two ranks launched inside an inner run, then by the script twice (~20 s); by
# default the check's own claim is exact equality, which any changed bit fails
def test_a_float8_all_gather_that_scales_each_shard_by_its_own_amax_fails(pytester, suite_copy, capsys, tmp_path):
    """torchao with the amax all-reduce of its float8 all-gather forgotten: each rank casts its shard
    with its own scale and the gathered weight is decoded with one, so training departs at once.
    The failure's script forks two gloo ranks itself: exit 1 naming the faulty sharding, 0 with
    torch's ``fully_shard`` in its place (the edit standing for the fix)."""
    faulty = "faults.distributed:fully_shard_with_local_float8_amax"
    run = run_scaled(
        pytester,
        suite_copy,
        "fp8/test_float8_all_gather.py",
        fsdp_shard=repr(faulty),
        args=(f"--amp-report-dir={pytester.path / 'out'}",),
    )
    assert_caught(run, "*::test_float8_all_gather_under_fsdp2_trains_bit_for_bit_as_without_it[[]cpu]")
    assert failed_rows(run) == {"fsdp2.float8_all_gather.max_loss_diff", "fsdp2.float8_all_gather.max_weight_diff"}
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "-o", str(tmp_path)]) == 0, capsys.readouterr()
    (script,) = tmp_path.glob("*.py")
    fixed = tmp_path / "fixed.py"
    fixed.write_text(
        script.read_text(encoding="utf-8").replace(repr(faulty), repr("torch.distributed.fsdp:fully_shard")),
        encoding="utf-8",
    )
    driver = fresh_driver(f"sys.path.insert(0, {str(TESTS)!r})")
    codes = {}
    for path in (script, fixed):  # one interpreter each: each forks its own ranks
        ran = subprocess.run(
            [sys.executable, "-I", "-c", driver, str(path)], capture_output=True, text=True, timeout=300
        )
        line = next((x for x in ran.stdout.splitlines() if x.startswith("CODES ")), None)
        assert line is not None, ran.stdout[-3000:] + ran.stderr[-3000:]
        codes.update(json.loads(line.removeprefix("CODES ")))
        assert "final shards differ" in ran.stdout or path == fixed, ran.stdout[-3000:]
    assert codes == {str(script): 1, str(fixed): 0}, codes


SPEED = "fp8/test_fp8_speed.py"


def test_a_kernel_set_without_fp8_matmul_judges_through_emulation_or_skips_naming_it(pytester, suite_copy):
    """oneDNN capped below its fp8 matmul (the Zen 4 and AVX2 kernel sets on an AMX CPU) raises from
    every ``_scaled_mm``: the kernel's own checks and the speed case skip naming the kernel set,
    Float8Linear and float8 training are judged through torchao's emulated matmul, nothing errors."""
    run = run_scaled(pytester, suite_copy, MATMUL, TRAINING, SPEED, args=("-rs",), **NO_KERNEL)
    judged = {
        "*::test_float8_linear_output_and_gradients_are_within_budget[[]cpu-*]",
        "*::test_float8_mlp_training_stays_within_the_fp32_seed_band[[]cpu-*]",
        "*::test_an_activation_outlier_mid_run_leaves_no_lasting_damage[[]cpu-*]",
    }
    assert_clean(run, at_least=6)
    missing = [p for p in judged if not any(fnmatch.fnmatchcase(t, p) for t in run.passed)]
    assert not missing, f"not judged through emulation: {missing}\n{run.text()}"
    skips = [t for t in run.skipped if "scaled_mm" in t and "thorough" not in t]
    assert {t.split("::")[1].split("[")[0] for t in skips} >= {
        SCALED_MM,
        "test_fp8_scaled_matmul_speed_meets_the_class_threshold",
    }
    run.stdout.fnmatch_lines(
        [f"*SKIPPED*torch._scaled_mm has no fp8 kernel on the CPU kernel set * (every call: {NO_FP8_KERNEL})*"],
        consecutive=False,
    )
    emulated = {r["metric"] for r in run.rows if str(r["metric"]).endswith("matmul_emulated")}
    assert {f"float8_linear.{r}.matmul_emulated" for r in ("tensorwise", "rowwise")} <= emulated
    speed = [r for r in run.rows if r["metric"] == "scaled_mm_e4m3.speedup"]
    assert [r["outcome"] for r in speed] == ["unjudged"] and "not measured" in speed[0]["note"]


def test_a_scaling_control_on_a_kernel_set_without_fp8_matmul_still_catches_its_fault(
    pytester, suite_copy, monkeypatch
):
    """The default broken adapter where ``_scaled_mm`` has no kernel (the Zen 4 and AVX2 sets on an
    AMX CPU): its scaled-matmul checks skip naming the kernel set, and the scaling checks still fail."""
    monkeypatch.setattr(kernels, "scaled_mm_missing", lambda device: f"no fp8 kernel ({NO_FP8_KERNEL})")
    run = run_scaled(
        pytester,
        suite_copy,
        SCALING,
        MATMUL,
        scaling="faults.fp8.BROKEN_SCALING['ScaleOffByTwo']()",
        args=SCALING_CHECKS,
        **NO_KERNEL,
    )
    expected = _on_this_kernel_set(run, MUST_CATCH["ScaleOffByTwo"])
    assert expected and all(SCALED_MM not in p for p in expected)
    assert_caught(run, *expected)


# -- delayed scaling ----------------------------------------------------------------------------------
DELAYED = "fp8/test_delayed_scaling.py"


def _delayed(pytester, suite_copy, impl: str):
    suite_copy(DELAYED, conftest=False)
    inject(pytester, "fp8", fixtures={"delayed_scaling_under_test": impl})
    return run_inner(pytester)


def test_the_plain_torch_delayed_scaling_meets_the_specification(pytester, suite_copy):
    assert_clean(_delayed(pytester, suite_copy, "faults.fp8.TorchDelayedScaling"), at_least=1)


@pytest.mark.parametrize(
    ("recipe", "took"),
    [
        ("PythonPathDelayedScaling", ("reciprocal_first",)),
        ("FusedKernelDelayedScaling", ("nan_ignored", "zero_not_recorded")),
    ],
)
def test_transformer_engines_two_update_paths_are_both_admitted(pytester, suite_copy, recipe, took):
    """The specification admits TransformerEngine's two update paths where they differ: a recipe
    written as its Python path (its buffer layout, ``float / tensor`` scales) and one following its
    fused kernel (NaN ignored in the max, amax 0 not recorded) both pass, and the row says they
    took those alternatives."""
    run = _delayed(pytester, suite_copy, f"faults.fp8.{recipe}")
    assert_clean(run, at_least=1)
    tags = json.loads(next(r["tags"] for r in run.rows if r["metric"] == "delayed_scaling.conforms"))
    assert all(tags.get(f"admitted.{t}", 0) > 0 for t in took), tags


@pytest.mark.parametrize(
    "fault",
    ["NeverRolls", "ScaleLagsAStep", "MarginTwice", "NonFiniteSetsScale", "OverflowStoresInf", "RoundTripDropsHistory"],
)
def test_a_broken_delayed_scaling_fails_the_specification_saying_where(pytester, suite_copy, fault):
    run = _delayed(pytester, suite_copy, f"faults.fp8.{fault}")
    assert_caught(run, "*::test_delayed_scaling_follows_its_specification")
    run.stdout.fnmatch_lines(["*delayed_scaling.conforms: FAILED*", "*specification*"], consecutive=False)
    failed = next(r for r in run.rows if r["metric"] == "delayed_scaling.conforms")
    assert "code a script cannot hold" in json.loads(failed["tags"])["no_script"]  # repro says why it has none
