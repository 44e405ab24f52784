"""The regression dashboard and run comparison: flag rules, loading, scale, and the rendered page
in a real headless browser."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import REPO, assert_clean, run_inner

from harness.apps import dashboard as db
from harness.apps.cli import main
from harness.storage import report as rp


# -- flag rules ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "flag", "direction"),
    [
        ([1.0, 1.0, 1.0], "insufficient data", ""),
        ([1.0, 1.01, 0.99, 1.0, 1.0], "ok", ""),
        ([1.0, 1.0, 1.0, 1.0, 2.0], "suspicious", "up"),
        ([1.0, 1.0, 1.0, 1.0, 0.5], "suspicious", "down"),
        ([1.0, 1.0, 1.0, 1.0, 2.0, 2.0], "regression", "up"),
        ([1.0, 1.0, 1.0, 1.0, 0.5, 0.5], "regression", "down"),  # an unexpected improvement is flagged too
        ([1.0, 1.0, 1.0, 1.0, 2.0, 0.5], "suspicious", "down"),  # two violations, opposite directions
    ],
)
def test_flag_rules(values, flag, direction):
    got = db.flag_history(values, None)  # no stated drift: the history's spread (1% noise here)
    assert (got["flag"], got["direction"]) == (flag, direction)


@pytest.mark.parametrize(
    ("values", "flag"),
    [
        ([1.0, 1.01, 0.99, 1.0, 1.0], "ok"),
        ([1.0, 1.0, 1.0, 1.0, 2.0], "ok"),  # a statistic's single excursion is not flagged
        ([1.0, 1.0, 1.0, 1.0, 2.0, 2.0], "regression"),
        ([1.0, 1.0, 1.0, 1.0, 0.5, 0.5], "regression"),
    ],
)
def test_a_statistic_is_flagged_only_when_its_excursion_repeats(values, flag):
    drift = [0.1] * len(values)  # relative
    got = db.flag_history(values, drift)
    assert got["flag"] == flag


def test_a_deterministic_value_is_flagged_on_any_change_a_statistic_only_beyond_its_drift():
    assert db.flag_history([2.0] * 5 + [2.0 + 1e-9], [0.0] * 6)["flag"] == "suspicious"
    assert db.flag_history([2.0] * 6, [0.0] * 6)["flag"] == "ok"
    assert db.flag_history([2.0] * 5 + [2.2], [0.14] * 6)["flag"] == "ok"  # +10% inside a 14% drift
    assert db.flag_history([2.0] * 5 + [3.0], [0.14] * 6)["flag"] == "ok"  # once outside: not yet
    assert db.flag_history([2.0] * 5 + [2.0 / 1.3] * 2, [0.14] * 7)["flag"] == "regression"  # 1.3x slower


def test_a_change_to_inf_or_nan_is_a_violation():
    assert db.flag_history([1.0] * 5 + [math.inf] * 2, [0.1] * 7)["flag"] == "regression"
    assert db.flag_history([1.0] * 5 + [math.nan], [0.0] * 6)["flag"] == "suspicious"
    assert db.flag_history([math.inf] * 6, [0.0] * 6)["flag"] == "ok"


def test_information_rows_are_never_flagged_and_never_in_the_largest_changes():
    values = [1.0, 500.0, 3.0, 900.0, 2.0, 7000.0, 1.0]
    ser = pd.DataFrame(
        {
            "profile": "p",
            "metric_id": "s/c/examples/-/cpu",
            "run_id": [f"r{i}" for i in range(len(values))],
            "value": values,
            "allowance": None,
            "comparable": False,
            "drift": None,
            "order": range(len(values)),
            "suite": "s",
            "started": None,
            "commit": None,
        }
    )
    assert db.flags(ser).empty and db.largest_changes(ser).empty
    assert not db.flags(ser.assign(comparable=True, drift=0.0)).empty


def test_trend_plots_draw_inf_and_nan_as_markers_with_a_note_never_an_empty_plot():
    assert db.nonfinite_note([1.0, math.inf, math.nan]) == "2 of 3 point(s) inf, nan: red x at the top edge"
    ser = pd.DataFrame(
        {
            "profile": "p",
            "metric_id": "m",
            "run_id": ["a", "b", "c"],
            "value": [math.inf, math.inf, math.inf],
            "allowance": None,
            "comparable": True,
            "drift": 0.0,
            "order": [0, 1, 2],
            "suite": "s",
            "started": ["2026-11-30T01:00:00+00:00", "2026-11-30T02:00:00+00:00", "2026-11-30T03:00:00+00:00"],
            "commit": ["abc1234def", None, "abc1234def"],
        }
    )
    ((metric, png),) = db._plots(ser, ["m"])
    assert metric == "m" and len(png) > 1000


def test_without_an_allowance_the_history_spread_decides():
    noisy = [1.0, 1.3, 0.7, 1.2, 0.8, 1.25]
    assert db.flag_history(noisy, None)["flag"] == "ok"
    assert db.flag_history([*noisy[:-1], 5.0], None)["flag"] == "suspicious"


def test_the_reference_is_the_median_of_the_previous_window():
    got = db.flag_history([100.0] * 10 + [1.0, 2.0, 3.0, 4.0, 5.0, 3.0], [0.5] * 16, window=5)
    assert got["reference"] == 3.0


# -- loading --------------------------------------------------------------------------------------
def _write_run(
    root: Path, run_id: str, values: dict[str, float], profile: str = "cpu-avx2", started: str = "2026-01-01"
) -> Path:
    rows = [
        rp.make_row(
            run_id=run_id,
            nodeid="n",
            suite="s",
            check="c",
            metric=m,
            value=v,
            allowance=0.1,
            outcome="pass",
            profile=profile,
        ).as_dict()
        for m, v in values.items()
    ]
    return rp.write(root, run_id, rows, {"profile": profile, "started": started, "tests": {"passed": 1}})


def test_a_corrupt_or_too_new_report_is_named_and_skipped(tmp_path):
    _write_run(tmp_path, "r1", {"m": 1.0}, started="2026-01-01")
    bad = _write_run(tmp_path, "r2", {"m": 1.0}, started="2026-01-02")
    (bad / rp.ROWS_PARQUET).write_bytes(b"not parquet")
    new = _write_run(tmp_path, "r3", {"m": 1.0}, started="2026-01-03")
    meta = json.loads((new / rp.RUN_JSON).read_text())
    (new / rp.RUN_JSON).write_text(json.dumps({**meta, "schema_version": rp.SCHEMA_VERSION + 1}))
    loaded = db.load_reports([tmp_path])
    assert list(loaded.runs["run_id"]) == ["r1"]
    assert any("r2" in p and "unreadable parquet" in p for p in loaded.problems)
    assert any("r3" in p and "newer than this harness reads" in p for p in loaded.problems)


def test_an_older_schema_without_some_columns_loads(tmp_path):
    run = _write_run(tmp_path, "r1", {"m": 1.0})
    df = pd.read_parquet(run / rp.ROWS_PARQUET).drop(columns=["note", "tags"])
    df.to_parquet(run / rp.ROWS_PARQUET)
    loaded = db.load_reports([run])
    assert list(loaded.rows.columns) == list(rp.COLUMNS) and len(loaded.rows) == 1


def test_cli_compare_prints_writes_csv_and_exits_1_when_a_metric_is_beyond_its_allowance(tmp_path, capsys):
    a = _write_run(tmp_path, "a", {"x": 1.0, "y": 2.0, "only_a": 3.0})
    b = _write_run(tmp_path, "b", {"x": 1.05, "y": 2.5})
    assert main(["compare", str(a), str(a)]) == 0
    assert main(["compare", str(a), str(b), "--csv", str(tmp_path / "cmp.csv")]) == 1
    out = capsys.readouterr().out
    assert "2 shared metrics, 1 beyond their allowance" in out
    csv = pd.read_csv(tmp_path / "cmp.csv")
    row = csv[csv.metric_id.str.contains("/y/")].iloc[0]
    assert (row.value_a, row.value_b, row.delta, row.flag) == (2.0, 2.5, 0.5, "BEYOND ALLOWANCE")


# -- scale ------------------------------------------------------------------------------------------
def _synthetic(runs: int, metrics: int) -> db.Loaded:
    rng = np.random.default_rng(0)
    run_ids = [f"r{i:04d}" for i in range(runs)]
    profiles = np.where(np.arange(runs) % 2 == 0, "cpu-avx512bf16", "nvidia-h200")
    values = 1.0 + 0.01 * rng.standard_normal((runs, metrics))
    values[-4:, :5] += 1.0  # a regression in five metrics: the last two runs of each profile
    n = runs * metrics
    rows = pd.DataFrame(
        {
            "run_id": np.repeat(run_ids, metrics),
            "nodeid": "n",
            "suite": np.tile([f"suite{j % 7}" for j in range(metrics)], runs),
            "check": "c",
            "metric": np.tile([f"m{j}" for j in range(metrics)], runs),
            "value": values.ravel(),
            "unit": "",
            "expected": np.nan,
            "allowance": 0.1,
            "outcome": "pass",
            "dtype": "bfloat16",
            "device": "cpu",
            "profile": np.repeat(profiles, metrics),
            "tags": "{}",
            "note": "",
            "recorded_at": "",
            "comparable": True,
            "drift": 0.1,  # relative: the 1% noise stays inside, the +100% regression does not
        }
    )
    assert len(rows) == n
    run_df = pd.DataFrame(
        {
            "run_id": run_ids,
            "started": [f"2026-{i:06d}" for i in range(runs)],
            "profile": profiles,
            "device": "cpu",
            "torch": "2.13",
            "cuda": None,
            "harness": "0.1.0",
            "schema": 1,
            "verdict": "PASS",
            "rows": metrics,
        }
    )
    return db.Loaded(rows, run_df)


#: The issue's budget for 1,000 runs x 500 metrics on these 2-core machines, in CPU seconds of this
#: process: wall clock on a shared machine counts the time other jobs hold the cores (measured on
#: an AVX2-only AMD Zen 3 beside other jobs: 7.6 to 14.7 s wall for the same work).
SCALE_BUDGET_S = 10.0


@pytest.mark.amp_thorough  # about 9 s of the 10 s budget on the Intel kind: a scale test, not a default check
def test_a_dashboard_over_1000_runs_of_500_metrics_builds_within_budget(benchmark):
    loaded = _synthetic(1000, 500)
    start = time.process_time()
    page = benchmark.pedantic(db.render, args=(loaded,), rounds=1, iterations=1)
    elapsed = time.process_time() - start
    assert elapsed <= SCALE_BUDGET_S, (
        f"dashboard over 1000 runs x 500 metrics took {elapsed:.1f} CPU s (budget {SCALE_BUDGET_S} s)"
    )
    assert page.count("class='regression'") >= 5


# -- end to end in a real browser ---------------------------------------------------------------
def test_dashboard_of_two_real_runs_renders_in_headless_chromium(tmp_path, pytester, suite_copy):
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is missing: .ci/run installs Debian's chromium (apt-get install chromium)")
    suite_copy("formats/test_format_limits.py")
    shutil.copytree(REPO / "baselines" / "formats", pytester.path / "baselines" / "formats")  # its stored table
    for _ in range(2):  # real runs, in process (a fresh interpreter would cost seconds)
        assert_clean(run_inner(pytester, f"--amp-report-dir={tmp_path / 'reports'}"), at_least=1)
    html_path = tmp_path / "dashboard.html"
    assert main(["dashboard", str(tmp_path / "reports"), "-o", str(html_path)]) == 0
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    shot = tmp_path / "dashboard.png"
    r = subprocess.run(
        [chromium, *flags, "--window-size=1280,2400", f"--screenshot={shot}", html_path.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", html_path.as_uri()], capture_output=True, text=True, timeout=120
    )
    console_errors = [
        line
        for line in (r.stderr + dom.stderr).splitlines()
        if "CONSOLE" in line and re.search(r"error|Uncaught", line, re.I)
    ]
    assert not console_errors, console_errors
    assert shot.exists() and shot.stat().st_size > 10_000
    artifacts = REPO / "amp-reports" / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    shutil.copy(shot, artifacts / "dashboard-e2e.png")
    page = dom.stdout
    assert page.count("<img") >= 1, "no trend plot rendered"
    assert page.count("<table") >= 3, "runs, pass/fail matrix or largest-changes table missing"
    assert "Pass/fail matrix" in page and "formats" in page
