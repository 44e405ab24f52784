"""Negative controls: compile-only faults, handed to the real compiled suite as its backend
(``amp_compile_backend``), fail the check named for them; the same AOTAutograd backend without
the fault passes those checks. Eager is never touched: whatever fails, the "compiler" caused it."""

from __future__ import annotations

import pytest
from helpers import assert_caught, assert_clean, inject, run_inner

from harness.apps.cli import main
from harness.domains.compiled import speed as compiled_speed
from harness.domains.engines.bench import bench
from harness.platform.hardware import detect
from harness.storage import profiles

FILES = (
    "compiled/test_compiled_policy.py",
    "compiled/test_compiled_numerics.py",
    "compiled/test_compiled_training.py",
    "compiled/test_compiled_known_issues.py",
    "compiled/test_compiled_scalars.py",
    "compiled/test_compiled_heads.py",
)


@pytest.fixture(scope="module")
def _compile_modules_imported_outside_pytester():
    """Compile one function with Inductor before the speed control's in-process run (it compiles
    with Inductor; the other controls use AOTAutograd backends): Inductor imports more modules when it first builds C++ (setuptools among
    them, and operator libraries registered once), and pytester's in-process runs drop the modules
    they import. tests/conftest.py warms up the AOTAutograd part. Skipped where the toolchain is
    missing (the suite then skips too)."""
    import torch

    from harness.domains.compiled import nested, runs
    from harness.domains.engines.compiler import toolchain

    if toolchain.unavailable("cpu") is not None:
        return
    cpu = torch.device("cpu")
    model, x = nested.make(cpu)
    with bench.timing_threads(cpu):  # as the compiled suite compiles (its conftest says why)
        nested.run(runs.compile_fn(nested.call_region, "inductor"), model, x, torch.bfloat16)
    torch._dynamo.reset()


def _suite(pytester, suite_copy, backend: str, **fixtures: str) -> None:
    suite_copy(*FILES)  # with the suite's conftest; the backend is injected above it
    inject(pytester, "", fixtures={"amp_compile_backend": f"faults.compiled.{backend}", **fixtures})


def test_the_named_checks_pass_with_the_fault_free_backend(pytester, suite_copy):
    _suite(pytester, suite_copy, "CLEAN")
    run = run_inner(
        pytester,
        "-k",
        "eager_dtypes or error_stays_within or autocast_disabled_region or compiled_training or "
        "(known_issue and compiled-backward) or rounds_a_python_scalar_as_eager or losses_sharing_logits",
    )
    # bf16: policy, numerics, region forward, region backward, known issue, training, the 7 scalar
    # cases, the losses sharing logits; the rest of the selection (fp16 on the CPU) is thorough
    assert_clean(run, at_least=14)


@pytest.mark.parametrize(
    ("backend", "selection", "failing", "lines"),
    [
        pytest.param(
            "AUTOCAST_DROPPED",
            "eager_dtypes",
            ("*eager_dtypes*[[]cpu-bf16]",),
            ["*compiled block dtypes*FAILED*", "*forward.logits*bfloat16*float32*"],
            id="autocast dropped: low-precision ops left in fp32",
        ),
        pytest.param(
            "LOW_PRECISION_ACCUMULATION",
            "error_stays_within",
            ("*error_stays_within*[[]cpu-bf16]",),
            ["*forward.linear (bfloat16, default): compiled error * vs eager *: excess * > budget *"],
            id="GEMMs accumulating in low precision",
        ),
        pytest.param(
            "AUTOCAST_LEAKING_INTO_DISABLED_REGIONS",
            "stays_fp32_in_the_compiled_forward",
            ("*stays_fp32_in_the_compiled_forward[[]cpu-bf16]",),
            ["*forward.out: |compiled - eager| is *x twice the fp32 evaluation bound*"],
            id="autocast leaking into a disabled region",
        ),
        pytest.param(
            "BACKWARD_UNDER_AUTOCAST",
            "stays_fp32_in_the_compiled_backward",
            ("*stays_fp32_in_the_compiled_backward*[[]cpu-bf16]",),
            ["*grad.fp32.weight: |compiled - eager| is *x twice the fp32 evaluation bound*"],
            id="backward traced under the forward's autocast",
        ),
        pytest.param(
            "UNROUNDED_SCALARS",
            "rounds_a_python_scalar_as_eager",
            tuple(
                f"*rounds_a_python_scalar_as_eager*[[]cpu-bf16-{c}]"
                for c in ("gt", "eq", "sub_relu_mask", "clamp_add_grad", "margin_ranking_grad", "fmod", "remainder")
            ),
            ["*compiled gradient of margin_ranking_loss*at input 1.703125, bfloat16, S = 1.7 (rounded rule -1.0*"],
            id="Python scalars kept unrounded",
        ),
        pytest.param(
            "SOFTMAX_IN_LOW_PRECISION",
            "losses_sharing_logits",
            ("*losses_sharing_logits*[[]cpu-bf16]",),
            ["*forward.loss.cross_entropy (bfloat16, heads): compiled error * vs eager *: excess * > budget *"],
            id="softmax family computed in bf16",
        ),
        pytest.param(
            "REMOVED_BUFFER_ASSERTION",
            "losses_sharing_logits",
            ("*losses_sharing_logits*[[]cpu-bf16]",),
            ["*compiled.heads.builds: FAILED*", "*entropy_bonus alone: AssertionError: buf0*"],
            id="shared logits' backward that does not build",
        ),
        pytest.param(
            "SATURATING_OVERFLOW",
            "compiled_training and mlp-fp16",  # thorough on the CPU: the run asks for that tier
            ("*compiled_training*[[]cpu-mlp-fp16+scaler]",),
            ["*GradScaler state against eager: FAILED*", "*final_scale: expected *, got *"],
            id="overflow saturated inside the compiled step",
        ),
        pytest.param(
            "BACKWARD_OUTSIDE_AUTOCAST",
            "known_issue and compiled-backward",
            ("*known_issue*[[]cpu-bf16-compiled-backward-under-forward-autocast]",),
            ["*known issue compiled-backward-under-forward-autocast appears fixed in torch *"],
            id="a release that fixes a registered issue",
        ),
        pytest.param(
            "AUTOCAST_DTYPE_CACHED",
            "known_issue and autograd-cache and bf16",  # thorough on the CPU: the run asks for that tier
            ("*known_issue*[[]cpu-bf16-autograd-cache-ignores-autocast-dtype]",),
            ["*known issue autograd-cache-ignores-autocast-dtype*was fixed in torch 2.13*a regression*"],
            id="a cache serving one autocast dtype's graph to another",
        ),
    ],
)
def test_a_compile_only_fault_fails_the_check_named_for_it(pytester, suite_copy, backend, selection, failing, lines):
    _suite(pytester, suite_copy, backend)
    tier = ["--amp-tier=thorough"] if any(t in selection for t in ("fp16", "autograd-cache")) else []
    run = run_inner(pytester, "-k", selection, *tier)
    assert_caught(run, *failing)
    run.stdout.fnmatch_lines(lines, consecutive=False)


@pytest.mark.amp_thorough  # two cold Inductor compiles, about 30 s on 2 cores; the speed gate's own
# control (tests/test_speed_and_qualify.py) shows the same judgement failing a slowed path by default
@pytest.mark.usefixtures("_compile_modules_imported_outside_pytester")
@pytest.mark.amp_timing
def test_a_compiled_amp_path_made_1_3x_slower_fails_the_calibrated_threshold(pytester, suite_copy, tmp_path):
    """Calibrated into a temporary baseline dir (so this holds on any CPU kind): the compiled-AMP
    speedup over eager AMP, with the compiled path slowed by the speed gate's DETECT_SLOWDOWN,
    fails; a case whose calibration scattered too much to be judged cannot show it and skips."""
    case = compiled_speed.DEFAULT_CASES[0]
    root = tmp_path / "baselines"
    assert main(["calibrate", "--baseline-dir", str(root), "--runs", "3", "--cases", "/".join(case)]) == 0
    th = profiles.load(root, detect().cpu_class.id).threshold(*case)
    if th is None or not th.judged:
        pytest.skip(f"calibration here was too noisy to judge {case}: {th}")
    suite_copy("compiled/test_compiled_speed.py")
    inject(pytester, "", fixtures={"_amp_slowdown": repr(bench.DETECT_SLOWDOWN)})
    run = run_inner(pytester, f"--amp-baseline-dir={root}", "-k", f"{case[0]}-{case[1]}", "-rA")
    if not run.failed and any(r["outcome"] == "noisy" for r in run.rows):
        pytest.skip(f"the slowed run of {case} came out NOISY here: this run cannot show the catch (not a pass)")
    assert_caught(run, f"*::test_compiled_amp_speedup_meets_the_class_threshold[[]cpu-{case[0]}-{case[1]}]")
    run.stdout.fnmatch_lines(["*AMP speedup *x is below the cpu-* threshold *x*"], consecutive=False)


def test_without_a_compiler_toolchain_the_suite_skips_saying_what_is_missing(pytester, suite_copy):
    suite_copy(*FILES)
    inject(
        pytester,
        "",
        patches={"harness.domains.engines.compiler.toolchain.unavailable": "faults.compiled.toolchain_missing"},
    )
    run = run_inner(pytester, "-rs", "-k", "eager_dtypes or stays_fp32 or compiled_training")
    assert not run.passed and not run.failed and run.skipped, run.text()
    run.stdout.fnmatch_lines(
        ["*no working compiler toolchain: Inductor's CPU backend needs a C++ compiler: 'g++'*not on PATH*"],
        consecutive=False,
    )


def test_the_toolchain_probe_names_a_missing_compiler():
    import torch._inductor.config as inductor_config

    from harness.domains.engines.compiler import toolchain

    # inductor's own config patch (monkeypatch would delete the entry on undo: config classes keep
    # their values outside __dict__)
    with inductor_config.patch({"cpp.cxx": ("/nonexistent/g++",)}):
        toolchain.unavailable.cache_clear()
        try:
            reason = toolchain.unavailable("cpu")
        finally:
            toolchain.unavailable.cache_clear()
    assert reason is not None and "C++ compiler" in reason and "/nonexistent/g++" in reason, reason
    assert toolchain.unavailable("cpu") is None


EXPORTED = "compiled/test_exported_autocast.py"


def test_an_export_that_drops_autocast_regions_fails_the_export_check(pytester, suite_copy):
    """torch 2.4's non-strict export, re-created: the program has none of the module's autocast
    regions and runs them in fp32. The non-strict cells fail naming the outputs' dtypes (the
    registry lists the issue only up to 2.5), and its registry check reads it outside its range."""
    suite_copy(EXPORTED, conftest=False)
    inject(pytester, "compiled", patches={"torch.export.export": "faults.compiled.export_dropping_autocast"})
    run = run_inner(pytester, "-k", "non_strict or nonstrict")
    assert_caught(
        run,
        "*::test_an_exported_program_runs_the_autocast_regions_of_its_module[[]cpu-*-non_strict]",
        "*::test_known_issue_status_matches_the_registry[[]cpu-export-nonstrict-drops-autocast-regions]",
    )
    run.stdout.fnmatch_lines(["*linear: eager torch.bfloat16, exported torch.float32*"], consecutive=False)


def test_strict_exports_nested_regions_fail_the_export_check_without_their_registry_entry(pytester, suite_copy):
    """Real history: on a release with the bug (2.5 on), the strict cells are judged once the
    registry no longer lists it, and fail naming what went wrong (from 2.8: the dtype assertion
    the exported program stopped on)."""
    import torch

    from harness.domains.compiled import exported

    if exported.missing("strict") or not exported.differences(
        exported.run("strict", torch.device("cpu"), torch.bfloat16)
    ):
        pytest.skip(f"torch {torch.__version__}'s strict export gives eager's outputs: nothing to catch")
    suite_copy(EXPORTED, conftest=False)
    inject(
        pytester,
        "compiled",
        patches={
            "harness.domains.compiled.known_issues.KNOWN_ISSUES": "faults.compiled.export_assertion_fixed_in_this_release"
        },
    )
    run = run_inner(pytester, "-k", "strict and not non_strict and not nonstrict")
    assert_caught(
        run,
        "*::test_an_exported_program_runs_the_autocast_regions_of_its_module[[]cpu-*-strict]",
        "*::test_known_issue_status_matches_the_registry[[]cpu-export-strict-nested-autocast-regions]",
    )
    run.stdout.fnmatch_lines(["*strict export under torch.bfloat16 regions: the *raised*"], consecutive=False)
