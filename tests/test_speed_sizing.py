"""Speed that means something on a GPU: each case at the smallest rung of its size ladder that is
compute-bound on the device, each path's achieved rate against the device's peak, and the physics
floor: on a GPU whose tensor cores run the AMP dtype, a compute-bound case slower in AMP than in
fp32 fails whatever the class's calibration says. No GPU here: the sizing and the floor are shown
on a simulated H200 (datasheet peaks, an assumed launch floor, call times on a roofline), the CPU
kinds on the real machine.
"""

from __future__ import annotations

import pytest
import torch

from harness.domains.engines.bench import bench, sizing
from harness.domains.speed import thresholds
from harness.domains.speed import verdict as speed
from harness.domains.speed.checks import ClassSpeed, SpeedChecks
from harness.domains.speed.workloads import WORKLOADS
from harness.numerics.verdict import Outcome
from harness.platform.hardware import CpuInfo
from harness.platform.peaks import cpu_frequency_hz, cpu_peaks

H200 = sizing.SIMULATED_H200
LADDERED = [w for w in WORKLOADS.values() if w.sizes]


def _modelled(device: sizing.DeviceSpeed):
    def time_of(w: bench.Workload) -> float:
        assert w.flops is not None
        return device.modelled_call_s(w.flops)

    return time_of


@pytest.mark.parametrize("workload", LADDERED, ids=lambda w: w.name)
def test_on_a_simulated_h200_each_case_runs_at_its_smallest_compute_bound_rung(workload):
    chosen = sizing.choose(workload, H200.launch_floor_s, _modelled(H200))
    time_of = _modelled(H200)
    assert chosen.compute_bound, chosen.describe()
    assert time_of(chosen.workload) >= sizing.COMPUTE_BOUND * H200.launch_floor_s
    lower = [s for s in workload.sizes if s < chosen.size]
    assert all(time_of(workload.at(s)) < sizing.COMPUTE_BOUND * H200.launch_floor_s for s in lower), "the smallest"
    if workload.name.startswith("matmul"):
        assert chosen.size >= 2048, f"an H200 matmul runs at thousands per side, not {chosen.size}"


def test_the_launch_bound_sizes_of_the_first_h200_run_are_not_compute_bound():
    """What the H200 qualification measured (matmul 512 at 0.54x fp32) was launches: by the rule."""
    small = WORKLOADS["matmul_512"]
    assert _modelled(H200)(small) < sizing.COMPUTE_BOUND * H200.launch_floor_s


def test_on_this_cpu_every_default_case_keeps_its_size():
    """The CPU kinds' first rungs are compute-bound already: the suite's sizes, and its time, stay."""
    floor = sizing.launch_floor(torch.device("cpu"))
    for name, _ in thresholds.DEFAULT_CASES:
        w = WORKLOADS[name]
        if not w.sizes:
            continue
        first = w.at(w.sizes[0])
        t = sizing.fp32_call_s(first, torch.device("cpu"))
        assert t >= sizing.COMPUTE_BOUND * floor, f"{name}: {t * 1e6:.3g} us, floor {floor * 1e6:.3g} us"


def _timing(speedup: float, rounds: int = 8) -> bench.Timing:
    """A measurement whose rounds all read ``speedup`` (to a part in a thousand)."""
    amp = tuple(1e-3 * (1 + 1e-3 * i) for i in range(rounds))
    return bench.Timing(tuple(a * speedup for a in amp), amp, bench.CUDA_EVENTS)


def _sized(name: str = "matmul_1024") -> sizing.Sizing:
    return sizing.choose(WORKLOADS[name], H200.launch_floor_s, _modelled(H200))


@pytest.mark.parametrize(
    "threshold",
    [
        None,
        thresholds.Threshold("judge", 0.5, "calibrated (a launch-bound rung)"),
        thresholds.Threshold("record", None, "too noisy"),
    ],
    ids=["uncalibrated", "calibrated-below-1", "recorded"],
)
def test_a_bf16_case_slower_than_fp32_on_tensor_cores_fails_whatever_the_calibration(threshold):
    floor = sizing.physics_floor(H200, _sized(), "bfloat16")
    assert floor is not None and floor.minimum == 1.0
    slow = _timing(0.8)
    with_floor = speed.judge("matmul_1024", "bfloat16", "h200", slow, threshold, "calibrate", floor)
    assert with_floor.outcome is Outcome.FAIL and "physics floor" in with_floor.reason
    assert with_floor.limit == 1.0 and not with_floor.claim().passed
    # the control: without the floor the calibration decides (a pass, or no verdict)
    without = speed.judge("matmul_1024", "bfloat16", "h200", slow, threshold, "calibrate")
    assert without.outcome is not Outcome.FAIL
    fast = speed.judge("matmul_1024", "bfloat16", "h200", _timing(6.0), threshold, "calibrate", floor)
    assert fast.outcome is Outcome.PASS


def test_the_floor_holds_only_for_compute_bound_arithmetic_on_matrix_units():
    assert sizing.physics_floor(H200, _sized(), "bfloat16") is not None
    assert sizing.physics_floor(H200, sizing.choose(WORKLOADS["layer_norm"], 1e-5, _modelled(H200)), "bfloat16") is None
    launch_bound = sizing.Sizing(WORKLOADS["matmul_256"], 256, 1e-5, H200.launch_floor_s, False)
    assert sizing.physics_floor(H200, launch_bound, "bfloat16") is None
    cpu = sizing.DeviceSpeed("cpu", "cpu", 5e-6, {"float32": 1e11})
    assert sizing.physics_floor(cpu, _sized(), "bfloat16") is None, "AMP slower on a CPU is a finding"


class _Rows:
    """A RowRecorder keeping rows in a list (no pytest session)."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def __call__(self, metric, value, **fields):
        self.rows.append({"metric": metric, "value": value, **fields})

    def result(self, result, *, repro=None, **kw):
        m = result.measurement()
        self(m.metric, m.value, outcome=result.outcome, allowance=m.allowance, **kw)
        return result.passed

    def repro_tags(self, repro):
        return {}


def test_speed_checks_fail_a_slower_bf16_case_on_a_simulated_h200_and_record_the_rates(monkeypatch):
    """The whole check, its measurement replaced by one that reads 0.8x: FAIL against the floor,
    with each path's achieved rate and fraction of the H200's peak recorded."""
    monkeypatch.setattr(bench, "measure", lambda *a, **k: _timing(0.8))
    monkeypatch.setattr(sizing, "fp32_call_s", lambda w, d: _modelled(H200)(w))
    rows = _Rows()
    cls = ClassSpeed("cuda-nvidia-h200-sim", lambda w, d: thresholds.Threshold("judge", 0.5, "calibrated", size=4096))
    checks = SpeedChecks(rows, torch.device("cpu"), cls, H200)
    with pytest.raises(AssertionError, match="physics floor"):
        checks.check(WORKLOADS["matmul_1024"], "bfloat16")
    [speedup] = [r for r in rows.rows if r["metric"] == "matmul_1024.speedup"]
    assert speedup["outcome"] is Outcome.FAIL and speedup["tags"]["size"] == 4096
    rates = {r["metric"]: r for r in rows.rows if r["metric"].endswith("flops_per_s")}
    amp = rates["matmul_1024.amp.flops_per_s"]
    assert amp["expected"] == H200.peaks["bfloat16"]
    assert amp["tags"]["fraction_of_peak"] == pytest.approx(amp["value"] / H200.peaks["bfloat16"])


def test_a_cpus_peak_is_its_cores_clock_and_fma_units():
    zen3 = CpuInfo("AMD EPYC", "x86_64", 2, ("avx2", "fma", "f16c"), "AuthenticAMD", 25, 1)
    p = cpu_peaks(zen3, 1, 2.5e9, "test")
    assert p.flops["float32"] == pytest.approx(2.5e9 * 32)  # two 256-bit FMA pipes
    assert p.flops["bfloat16"] == p.flops["float32"], "converted to fp32 where bf16 is emulated"
    zen4 = CpuInfo("AMD EPYC", "x86_64", 2, ("avx2", "fma", "avx512f", "avx512_bf16"), "AuthenticAMD", 25, 17)
    assert cpu_peaks(zen4, 2, 2.5e9).flops["bfloat16"] == pytest.approx(2 * 2 * 2.5e9 * 32)
    unknown = CpuInfo("?", "x86_64", 2, ("avx2",), "GenuineIntel", 6, 1)
    assert cpu_peaks(unknown, 1, 2.5e9).flops == {}, "an unknown microarchitecture has no peak"


def test_the_clock_comes_from_cpufreq_else_proc_cpuinfo(tmp_path):
    (tmp_path / "cpuinfo_max_freq").write_text("3700000\n")
    assert cpu_frequency_hz("cpu MHz\t\t: 2445.424\n", tmp_path) == (3.7e9, "cpufreq cpuinfo_max_freq")
    assert cpu_frequency_hz("cpu MHz\t\t: 2445.424\n", tmp_path / "none") == (2445.424e6, "/proc/cpuinfo cpu MHz")
    assert cpu_frequency_hz("model name : x\n", tmp_path / "none") == (None, "")


def test_every_cpu_speed_row_with_a_flop_count_carries_its_rate_and_fraction(monkeypatch):
    """On this CPU, a real measurement: the matmul's rows carry the achieved rate and, where this
    microarchitecture's peak is known, the fraction of it."""
    speed_of = sizing.device_speed(torch.device("cpu"))
    rows = _Rows()
    checks = SpeedChecks(rows, torch.device("cpu"), ClassSpeed("cpu-test", lambda w, d: None), speed_of, rounds=2)
    checks.check(WORKLOADS["matmul_256"], "float16")
    rates = [r for r in rows.rows if r["metric"].endswith("flops_per_s")]
    assert {r["metric"] for r in rates} == {"matmul_256.fp32.flops_per_s", "matmul_256.amp.flops_per_s"}
    for r in rates:
        assert r["value"] > 0 and r["tags"]["size"] == 256
        if speed_of.peaks.get(r["dtype"]):
            assert 0 < r["tags"]["fraction_of_peak"] < 1.5, r
    [speedup] = [r for r in rows.rows if r["metric"] == "matmul_256.speedup"]
    assert speedup["tags"]["compute_bound"] and speedup["tags"]["amp_flops_per_s"] > 0


def test_the_dashboard_shows_each_classs_achieved_rates_and_fractions_of_peak(tmp_path):
    from harness.apps import dashboard as db
    from harness.storage import report as rp

    row = rp.make_row(
        run_id="r",
        nodeid="suites/speed/test_amp_speed.py::t",
        suite="speed",
        metric="matmul_1024.amp.flops_per_s",
        value=400e12,
        expected=989.4e12,
        dtype="bfloat16",
        tags={"fraction_of_peak": 400 / 989.4, "size": 4096},
    )
    meta = {"fingerprint": {"cpu_class": {"id": "cuda-h200"}}, "primary_device": "cpu", "started": "2026-01-01"}
    rp.write(tmp_path, "r", [row.as_dict()], meta)
    loaded = db.load_reports([tmp_path])
    [rate] = db.achieved_rates(loaded.rows, loaded.runs).to_dict("records")
    assert (rate["profile"], rate["case"], rate["path"], rate["size"]) == ("cuda-h200", "matmul_1024", "amp", 4096)
    assert rate["tflops"] == pytest.approx(400) and rate["fraction_of_peak"] == pytest.approx(0.404, abs=1e-3)
    assert "Achieved rate" in db.render(loaded)
