"""The kind is what the kernels are: ATen's capability and oneDNN's ISA cap name the hardware class
and the kernel set; ``amp-harness kernels`` runs a command as another kind; a speed case whose
rounds a kind cannot afford, or whose kernel it lacks, is recorded and says why, never judged on
rounds it did not take."""

from __future__ import annotations

import sys

import pytest
import torch

from harness.apps.cli import main
from harness.domains.engines.bench import bench
from harness.domains.engines.bench.workload import Workload
from harness.domains.speed import calibration, thresholds
from harness.platform.hardware import (
    KERNEL_SETS,
    CpuInfo,
    aten_capability,
    capped,
    cpu_class,
    kernel_set,
    onednn_isa_cap,
)

#: the calibrations below time their cases: under xdist each has the machine to itself
pytestmark = pytest.mark.amp_timing

#: the Intel kind with AMX (family 6 model 167), as /proc/cpuinfo lists its relevant flags
AMX_CPU = CpuInfo(
    "Intel Xeon",
    "x86_64",
    2,
    ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"),
    "GenuineIntel",
    6,
    167,
)
ZEN3 = CpuInfo("AMD EPYC", "x86_64", 2, ("avx2", "fma", "f16c"), "AuthenticAMD", 25, 1)


def _as(cpu: CpuInfo, environ: dict[str, str]) -> CpuInfo:
    return capped(cpu, onednn_isa_cap(environ), aten_capability(environ))


@pytest.mark.parametrize(
    ("environ", "klass"),
    [
        ({}, "cpu-intel-f6m167-amxbf16-fp16-t2"),
        # the AVX2 cap: the class said avx512 while every kernel was AVX2
        ({"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "cpu-intel-f6m167-avx2-t2"),
        # oneDNN alone capped: ATen's avx512 kernels still run (the flag stays while either uses it)
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "cpu-intel-f6m167-avx512-t2"),
        # ATen alone capped: oneDNN's AMX matmuls, ATen's AVX2 elementwise kernels: a class of its own
        ({"ATEN_CPU_CAPABILITY": "avx2"}, "cpu-intel-f6m167-amxbf16-fp16-atenavx2-t2"),
        ({"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "cpu-intel-f6m167-avx2-atendefault-t2"),
        # torch compares exact lowercase words and ignores anything else (with a warning)
        ({"ATEN_CPU_CAPABILITY": "AVX2"}, "cpu-intel-f6m167-amxbf16-fp16-t2"),
        ({"ATEN_CPU_CAPABILITY": "avx512"}, "cpu-intel-f6m167-amxbf16-fp16-t2"),  # not below the CPU's own
    ],
)
def test_the_aten_capability_and_the_onednn_cap_name_the_class(environ, klass):
    cpu = _as(AMX_CPU, environ)
    assert cpu_class(cpu, 2).id == klass
    assert cpu_class(cpu, 2).derived_from.get("aten_cpu_capability") == cpu.aten_capability


@pytest.mark.parametrize(
    ("name", "isa"), [("zen4", "avx512bf16"), ("avx2", "avx2"), ("intel-noamx", "avx512bf16-fp16")]
)
def test_each_kernel_set_runs_as_its_kind_on_a_cpu_that_has_it(name, isa):
    ks = KERNEL_SETS[name]
    on = ks.on(AMX_CPU)
    assert not ks.shortfall(AMX_CPU)
    assert cpu_class(on, 2).id == f"cpu-intel-f6m167-{isa}-t2"
    assert kernel_set(on).startswith(isa) and "oneDNN capped to" in kernel_set(on)


def test_a_kernel_set_cannot_add_what_the_cpu_lacks():
    """On an AVX2-only CPU the Zen 4 set runs the CPU's own kernels: its class is the CPU's, and the
    set names the flags it could not add."""
    zen4 = KERNEL_SETS["zen4"]
    assert cpu_class(zen4.on(ZEN3), 2).id == cpu_class(ZEN3, 2).id == "cpu-amd-zen3-f25m1-avx2-t2"
    assert set(zen4.shortfall(ZEN3)) == {"avx512f", "avx512_vnni", "avx512_bf16"}


def test_amp_harness_kernels_runs_a_command_as_the_kind(capfd):
    code = "import os, sys; print(os.environ['ONEDNN_MAX_CPU_ISA'], os.environ['ATEN_CPU_CAPABILITY']); sys.exit(3)"
    assert main(["kernels", "avx2", "--", sys.executable, "-c", code]) == 3  # the command's own status
    out = capfd.readouterr().out
    assert "AVX2 avx2" in out and "TORCHINDUCTOR_CACHE_DIR=" in out and "amp-harness-inductor-avx2" in out
    assert "hardware class cpu-" in out


def test_amp_harness_kernels_lists_the_sets_and_refuses_bad_names(capfd):
    assert main(["kernels"]) == 0
    out = capfd.readouterr().out
    assert all(name in out for name in KERNEL_SETS) and "ONEDNN_MAX_CPU_ISA=AVX2" in out
    assert main(["kernels", "zen9", "--", "true"]) == 2
    assert "unknown kernel set 'zen9'; choose from zen4, avx2, intel-noamx" in capfd.readouterr().err
    assert main(["kernels", "avx2"]) == 2
    assert "name the command to run after --" in capfd.readouterr().err


def _toy(missing: str | None = None) -> Workload:
    """A cheap case whose two paths are one fp32 matmul (the dtype, float8, has no contention probe)."""

    def make(device: torch.device, dtype: torch.dtype | None):
        a = torch.randn(64, 64, device=device)
        return lambda: a @ a

    return Workload("toy", make, None, unavailable=lambda device: missing)


def _calibrate(workload: Workload) -> calibration.CaseResult:
    lines: list[str] = []
    [result] = calibration.calibrate(
        [("toy", "float8_e4m3fn")],
        {"toy": workload},
        torch.device("cpu"),
        runs=2,
        rounds=bench.MIN_ROUNDS,
        stored={},
        log=lines.append,
        hardware_class="cpu-test",
    )
    return result


def test_a_case_whose_rounds_exceed_the_case_budget_is_recorded_saying_so(monkeypatch):
    """Where one round takes seconds (bf16 matmul 1024 on AVX2-only CPUs), the rounds a verdict
    needs do not fit the default tier: the case is recorded, not judged, and its origin says why."""
    monkeypatch.setattr(calibration, "CASE_BUDGET_S", 0.0)
    result = _calibrate(_toy())
    assert not result.threshold.judged
    assert "not judged on this class" in result.threshold.origin and "took" in result.threshold.origin


def test_a_case_within_the_budget_is_measured_and_placed():
    """The same toy case within the budget: measured over its runs and given a threshold (judged,
    or recorded because its runs scattered: either way not the budget's doing)."""
    result = _calibrate(_toy())
    assert "not judged on this class" not in result.threshold.origin
    assert result.threshold.calibrated_median is not None


def test_a_case_whose_kernel_is_missing_is_not_measured_and_says_which():
    result = _calibrate(_toy(missing="torch._scaled_mm has no fp8 kernel on the CPU kernel set avx2"))
    assert not result.threshold.judged and result.threshold.calibrated_median is None
    assert result.threshold.origin == "not measured: torch._scaled_mm has no fp8 kernel on the CPU kernel set avx2"


def test_an_unjudged_speedup_takes_the_rounds_that_fit_the_time_cap():
    """MIN_ROUNDS where they fit MAX_MEASURE_S, fewer where a round is long, never none; a fixed
    number, so pytest-benchmark's result holds every round."""
    policy = bench.Rounds.unjudged()
    assert policy.fitted(0.01) == bench.Rounds.fixed(bench.MIN_ROUNDS)
    assert policy.fitted(policy.max_s / 2) == bench.Rounds.fixed(2)
    assert policy.fitted(10 * policy.max_s) == bench.Rounds.fixed(1)  # bf16 matmul 1024 where emulated
    assert bench.Rounds().fitted(10 * policy.max_s) == bench.Rounds()  # a judged measurement: unchanged


def test_a_calibration_sizes_the_probe_to_the_kind_and_the_suite_reuses_it():
    """The probe's side comes from the calibration and is stored with the threshold: a probe that
    is slow here (bf16 emulated) is taken smaller, never changed between calibration and check."""
    cpu = torch.device("cpu")
    side = bench.probe_side(cpu, torch.bfloat16)
    assert side in bench.PROBE_SIDES
    probe = bench.contention_probe(cpu, torch.bfloat16, side)
    assert probe is not None and tuple(probe().shape) == (side, side)
    assert bench.probe_side(torch.device("cpu"), torch.float8_e4m3fn) is None  # no probe in float8
    stored = {"mm/bfloat16": thresholds.Threshold("judge", 1.0, "", 2.0, 0.001, probe_side=128)}
    assert thresholds.probe_reference(0.5, stored, "bfloat16", 128) == 0.001
    assert thresholds.probe_reference(0.5, stored, "bfloat16", 512) == 0.5  # another probe's time never counts


def test_a_case_whose_first_measurement_ran_faster_than_its_runs_is_recorded(monkeypatch):
    """The suite measures a case once, first in its process: where that measurement runs in a
    faster mode than the calibration's counted runs (fp16 matmul 256 on the AVX2 kind), a slowed
    path would pass, so the case is recorded, saying why. A slower first measurement changes nothing."""
    for first_speedup, judged in ((1.3, False), (0.7, True)):
        speedups = iter([first_speedup] + [1.0] * 20)

        def fake(*args, _speedups=speedups, **kwargs):
            s = next(_speedups)
            return bench.Timing((1.0,) * bench.MIN_ROUNDS, (1.0 / s,) * bench.MIN_ROUNDS)

        monkeypatch.setattr(bench, "measure", fake)
        result = _calibrate(_toy())
        assert result.threshold.judged is judged, result.threshold.origin
        if not judged:
            assert "the uncounted first measurement of toy/float8_e4m3fn ran 1.3x" in result.threshold.origin
