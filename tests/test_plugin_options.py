"""Options, tiers, device parametrization, CUDA skips and the lazy torch import of the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from harness.platform.hardware import KNOWN_PROFILES
from harness.storage import report as rp

QUIET = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--amp-device=tpu"], "*--amp-device='tpu': expected auto, cpu, cuda or cuda:N*"),
        (["--amp-dtypes=bf16,fp64"], "*--amp-dtypes='bf16,fp64': unknown fp64; choose from bf16, fp16*"),
        (["--amp-dtypes="], "*--amp-dtypes='': unknown (empty)*"),
        (["--amp-profile=nvidia-b999"], "*unknown hardware profile 'nvidia-b999'. Known profiles: cpu-amxbf16, *"),
        (["--amp-profile=CPU AVX"], "*malformed hardware profile 'CPU AVX'*Known profiles:*"),
        (["--amp-tier=nightly"], "*--amp-tier: invalid choice: 'nightly'*"),
    ],
)
def test_bad_option_values_are_usage_errors_that_say_what_is_allowed(pytester, args, message):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest(*QUIET, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_asking_for_cuda_without_it_is_an_error_naming_what_is_missing(pytester):
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest(*QUIET, "--amp-device=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-device=cuda: CUDA is missing: torch * (*)*"])


TIERED = """
import pytest

@pytest.mark.amp_quick
def test_quick():
    pass

@pytest.mark.amp_harness
def test_default():
    pass

@pytest.mark.amp_thorough
def test_thorough():
    pass

@pytest.mark.amp_cuda
def test_needs_cuda():
    pass

@pytest.mark.amp_harness
def test_hypothesis_profile(request):
    from hypothesis import settings
    print("PROFILE=" + settings.get_current_profile_name())
"""


def test_tiers_select_tests_and_say_how_to_run_the_others(pytester):
    pytester.makepyfile(test_tiers=TIERED)
    quick = pytester.runpytest(*QUIET, "--amp-tier=quick", "-rs")
    quick.assert_outcomes(passed=1, skipped=4)
    quick.stdout.fnmatch_lines(["*default tier: run with --amp-tier=default*"])
    default = pytester.runpytest(*QUIET, "-rs")
    default.stdout.fnmatch_lines(["*thorough tier: run with --amp-tier=thorough*"])
    outcomes = default.parseoutcomes()
    assert outcomes["passed"] == (4 if torch.cuda.is_available() else 3)
    thorough = pytester.runpytest(*QUIET, "--amp-tier=thorough", "-s")
    thorough.stdout.fnmatch_lines(["*PROFILE=amp-thorough*"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip reason on a machine without CUDA")
def test_cuda_tests_skip_with_the_reason(pytester):
    pytester.makepyfile(test_tiers=TIERED)
    result = pytester.runpytest(*QUIET, "-rs", "-k", "needs_cuda")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*CUDA is missing: torch * is a CPU-only build (torch.version.cuda is None)*"])


def test_the_hypothesis_profile_is_reproducible_by_default_and_an_explicit_option_wins(pytester, monkeypatch):
    pytester.makepyfile(test_tiers=TIERED)
    for ci in ("true", None):  # the same inside CI and outside: a run gives the same verdict anywhere
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        pytester.runpytest(*QUIET, "-s", "-k", "hypothesis").stdout.fnmatch_lines(["*PROFILE=amp-ci*"])
    explicit = pytester.runpytest(*QUIET, "-s", "-k", "hypothesis", "--hypothesis-profile=amp-dev")
    explicit.stdout.fnmatch_lines(["*PROFILE=amp-dev*"])


PARAMS = """
def test_params(amp_device, amp_dtype, amp_profile):
    print(f"PARAM {amp_device} {amp_dtype} {amp_profile}")
"""


def test_device_and_dtype_parametrization_follows_the_options(pytester):
    pytester.makepyfile(test_params=PARAMS)
    both = pytester.runpytest(*QUIET, "--amp-device=cpu", "-v", "--amp-no-report")
    both.stdout.fnmatch_lines(["*test_params[[]cpu-bf16] PASSED*", "*test_params[[]cpu-fp16] PASSED*"])
    one = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-dtypes=fp16", "-s", "--amp-no-report")
    one.assert_outcomes(passed=1)
    one.stdout.fnmatch_lines(["*PARAM cpu torch.float16 cpu-*"])


HEAVY_FP16 = """
import pytest

@pytest.mark.amp_thorough_dtypes("fp16")
def test_heavy(amp_dtype):
    pass
"""


def test_a_dtype_marked_thorough_runs_only_in_the_thorough_tier(pytester):
    pytester.makepyfile(test_heavy=HEAVY_FP16)
    default = pytester.runpytest(*QUIET, "--amp-device=cpu", "-rs", "-v", "--amp-no-report")
    default.stdout.fnmatch_lines(["*test_heavy[[]bf16] PASSED*", "*test_heavy[[]fp16] SKIPPED*"])
    default.stdout.fnmatch_lines(["*thorough tier: run with --amp-tier=thorough*"])
    thorough = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-tier=thorough", "--amp-no-report")
    thorough.assert_outcomes(passed=2)
    pytester.makepyfile(test_heavy=HEAVY_FP16.replace('"fp16"', '"fp8"'))
    wrong = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-no-report")
    wrong.assert_outcomes(errors=1)
    wrong.stdout.fnmatch_lines(["*amp_thorough_dtypes(fp8): not a dtype; choose from bf16, fp16*"])


HEAVY_FP16_ON = """
import pytest

@pytest.mark.amp_thorough_dtypes("fp16", on="{on}")
def test_heavy(amp_device, amp_dtype):
    pass
"""

HEAVY_CASE_ON = """
import pytest

@pytest.mark.parametrize("case", ["light", pytest.param("heavy", marks=pytest.mark.amp_thorough_on("{on}"))])
def test_heavy(case, amp_device):
    pass
"""


@pytest.mark.parametrize(
    ("source", "light", "heavy", "refusal", "refused_at_collection"),
    [
        # fp16 is the thorough tier on the CPU (a costly, rarely trained path there), default on CUDA;
        # a bad value is refused while parametrizing (a collection error, shown on stdout)
        (HEAVY_FP16_ON, "cpu-bf16", "cpu-fp16", "*amp_thorough_dtypes(on='tpu'): choose cpu or cuda*", True),
        # a bad value is refused when the tiers are decided (a usage error, on stderr)
        (HEAVY_CASE_ON, "cpu-light", "cpu-heavy", "*amp_thorough_on('tpu'): choose cpu or cuda*", False),
    ],
    ids=["amp_thorough_dtypes-on", "amp_thorough_on"],
)
def test_a_check_marked_thorough_on_one_device_type_is_thorough_there_only(
    pytester, source, light, heavy, refusal, refused_at_collection
):
    pytester.makepyfile(test_heavy=source.format(on="cpu"))
    on_cpu = pytester.runpytest(*QUIET, "--amp-device=cpu", "-v", "--amp-no-report")
    on_cpu.stdout.fnmatch_lines([f"*test_heavy[[]{light}] PASSED*", f"*test_heavy[[]{heavy}] SKIPPED*"])
    pytester.makepyfile(test_heavy=source.format(on="cuda"))
    on_cuda = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-no-report")
    on_cuda.assert_outcomes(passed=2)  # the CPU items are not the thorough ones
    pytester.makepyfile(test_heavy=source.format(on="tpu"))
    wrong = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-no-report")
    if refused_at_collection:
        wrong.stdout.fnmatch_lines([refusal])
    else:
        assert wrong.ret == pytest.ExitCode.USAGE_ERROR
        wrong.stderr.fnmatch_lines([refusal])


HEAVY_WHERE_EMULATED = """
import pytest

@pytest.mark.parametrize("case", ["light", pytest.param("heavy", marks=pytest.mark.amp_thorough_where_emulated({names}))])
def test_heavy(case, amp_device):
    pass
"""


def test_a_check_marked_thorough_where_bf16_is_emulated_is_thorough_on_avx2_kernels_only(pytester, monkeypatch):
    """Judged by the kernels in force (the caps of docs/running.md), not by the CPU's own flags:
    capped to AVX2 the heavy case is skipped saying why; where bf16 runs natively it runs."""
    from harness.platform.hardware import detect_cpu, emulated

    pytester.makepyfile(test_heavy=HEAVY_WHERE_EMULATED.format(names="'bf16'"))
    for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(name, raising=False)
    native = pytester.runpytest(*QUIET, "--amp-device=cpu", "-v", "--amp-no-report", "-rs")
    if emulated("bf16", detect_cpu()) is None:
        native.assert_outcomes(passed=2)
    else:  # this CPU has no native bf16 (an AVX2-only kind): the heavy case is thorough everywhere here
        native.assert_outcomes(passed=1, skipped=1)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    capped = pytester.runpytest(*QUIET, "--amp-device=cpu", "-v", "--amp-no-report", "-rs")
    capped.stdout.fnmatch_lines(
        [
            "*test_heavy[[]cpu-light] PASSED*",
            "*test_heavy[[]cpu-heavy] SKIPPED*",
            "*thorough tier where bf16 is emulated on avx2*none of avx512_bf16, amx_bf16: run with --amp-tier=thorough*",
        ]
    )
    thorough = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-no-report", "--amp-tier=thorough")
    thorough.assert_outcomes(passed=2)
    pytester.makepyfile(test_heavy=HEAVY_WHERE_EMULATED.format(names="'fp8'"))
    wrong = pytester.runpytest(*QUIET, "--amp-device=cpu", "--amp-no-report")
    assert wrong.ret == pytest.ExitCode.USAGE_ERROR
    wrong.stderr.fnmatch_lines(
        ["*amp_thorough_where_emulated: unknown low-precision dtype 'fp8'; choose from bf16, fp16*"]
    )


def test_profile_override_lands_in_rows_and_run_metadata(pytester):
    pytester.makepyfile(
        test_p="def test_p(amp_record, amp_profile):\n    amp_record('m', 1.0)\n    print('PROFILE', amp_profile)\n"
    )
    result = pytester.runpytest(*QUIET, "--amp-profile=cpu-avx2", "--amp-report-dir=out", "-s")
    result.stdout.fnmatch_lines(["*PROFILE cpu-avx2"])
    loaded = rp.load(rp.find_runs(pytester.path / "out")[0])
    assert loaded.rows["profile"].tolist() == ["cpu-avx2"]
    assert loaded.meta["options"]["profile_override"] == "cpu-avx2"


def test_plugin_imports_torch_lazily():
    code = "import sys, harness.pytest_plugin.hooks; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pandas', 'pyarrow'))))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_every_known_profile_is_documented():
    assert all(desc.strip() for desc in KNOWN_PROFILES.values())


def test_xdist_workers_are_pinned_to_their_own_gpu_round_robin():
    from harness.pytest_plugin.state import gpu_for_worker

    assert [gpu_for_worker(f"gw{i}", 4) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert gpu_for_worker(None, 4) == 0
    assert gpu_for_worker("gw3", 0) == 0


UNRELATED = """
import pytest
from hypothesis import given, settings, strategies as st

SEEN = {}

@given(st.integers())
def test_hypothesis_keeps_its_own_defaults(x):
    SEEN["profile"] = settings.get_current_profile_name()
    SEEN["deadline"] = settings().deadline

def test_report_profile():
    print("UNRELATED_PROFILE=" + SEEN["profile"] + " DEADLINE=" + str(SEEN["deadline"]))

@pytest.mark.thorough
def test_their_thorough_marker_runs():
    pass

@pytest.mark.cuda
def test_their_cuda_marker_runs():
    pass

@pytest.mark.quick
def test_their_quick_marker_runs():
    pass
"""


PLAIN = """
import sys

def test_plain():
    print("IMPORTED hypothesis=%s torch=%s" % ("hypothesis" in sys.modules, "torch" in sys.modules))
"""


def test_an_unrelated_project_is_untouched_by_the_installed_plugin(pytester):
    """A pytest11 plugin must be inert where it is not used: no hypothesis profile, no tier or CUDA
    skips of the project's own markers, no report directory."""
    pytester.makeini("[pytest]\nmarkers =\n    thorough: theirs\n    cuda: theirs\n    quick: theirs\n")
    pytester.makepyfile(test_unrelated=UNRELATED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--amp-tier=quick")
    result.assert_outcomes(passed=5)
    without = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-s", "-p", "no:amp_harness", "-p", "no:amp_harness_fixtures"
    )
    without.assert_outcomes(passed=5)
    [seen] = [line for line in result.outlines if "UNRELATED_PROFILE=" in line]
    [alone] = [line for line in without.outlines if "UNRELATED_PROFILE=" in line]
    assert seen == alone, f"with the plugin: {seen!r}; without it: {alone!r}"  # hypothesis' own choice, either way
    assert "UNRELATED_PROFILE=amp-" not in seen
    assert not (pytester.path / "amp-reports").exists()
    # a project that does not use hypothesis does not pay for importing it (nor torch)
    pytester.makepyfile(test_plain=PLAIN)
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "test_plain.py")
    plain.assert_outcomes(passed=1)
    plain.stdout.fnmatch_lines(["*IMPORTED hypothesis=False torch=False*"])


def test_run_metadata_names_the_hypothesis_profile_amp_harness_tests_ran_under(pytester, monkeypatch):
    """The harness loads its profile around its own tests only, so the profile active at session
    end is not the one to record."""
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(test_h="def test_h(amp_record):\n    amp_record('m', 1.0)\n")
    pytester.runpytest(*QUIET, "--amp-report-dir=chosen").assert_outcomes(passed=1)
    pytester.runpytest(*QUIET, "--amp-report-dir=explicit", "--hypothesis-profile=amp-dev").assert_outcomes(passed=1)
    profile = {
        d: rp.load(rp.find_runs(pytester.path / d)[0]).meta["options"]["hypothesis_profile"]
        for d in ("chosen", "explicit")
    }
    assert profile == {"chosen": "amp-ci", "explicit": "amp-dev"}
