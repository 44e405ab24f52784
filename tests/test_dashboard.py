"""The regression dashboard and run comparison: flag rules, loading, scale, and the rendered page
in a real headless browser."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from harness.apps import dashboard as db
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
    ((metric, svg),) = db._plots(ser, ["m"])
    assert metric == "m" and svg.startswith("<svg") and len(svg) > 1000


def test_every_plotted_point_shows_its_run_commit_and_value_on_hover():
    """Trend plots are inline SVG (zoom keeps them crisp); each finite point carries a <title>, the
    browser's hover text, naming the profile, value, run, time and commit."""
    ser = pd.DataFrame(
        {
            "profile": "cpu-x-t2",
            "metric_id": "m",
            "run_id": ["run-a", "run-b"],
            "value": [1.0, 2.5],
            "allowance": None,
            "comparable": True,
            "drift": 0.0,
            "order": [0, 1],
            "suite": "s",
            "started": ["2026-11-30T01:00:00+00:00", "2026-11-30T02:00:00+00:00"],
            "commit": ["abc1234def", "0123456789"],
        }
    )
    ((_, svg),) = db._plots(ser, ["m"])
    assert "<title>cpu-x-t2: 2.5 (run run-b, 2026-11-30T02:00:00+00:00, commit 01234567)</title>" in svg, svg[:500]
    assert svg.count("<title>cpu-x-t2: ") == 2


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
    assert list(loaded.rows.columns) == list(rp.LOADED_COLUMNS) and len(loaded.rows) == 1


# -- stacks, classes, changes ----------------------------------------------------------------------
def _stack_run(root: Path, run_id: str, torch: str, values: dict[str, float], started: str, cls: str = "cpu-x-t2"):
    rows = [
        rp.make_row(run_id=run_id, nodeid=f"suites/s/test_s.py::test_{m}", suite="s", check=f"test_{m}", metric=m,
                    value=v, outcome="fail" if v > 1 else "pass", profile="cpu-avx2").as_dict()
        for m, v in values.items()
    ]  # fmt: skip
    meta = {
        "profile": "cpu-avx2",
        "started": started,
        "tests": {"passed": 1},
        "primary_device": "cpu",
        "fingerprint": {"torch_version": torch, "cpu_class": {"id": cls}},
    }
    return rp.write(root, run_id, rows, meta)


def test_the_profile_column_is_the_hardware_class_and_the_stacks_view_uses_diff_statuses(tmp_path):
    _stack_run(tmp_path, "a1", "2.13.0+cpu", {"x": 0.5, "y": 0.5}, "2026-01-01")
    _stack_run(tmp_path, "a2", "2.13.0+cpu", {"x": 0.5, "y": 0.5}, "2026-01-02")
    _stack_run(tmp_path, "b1", "2.14.1+cu130", {"x": 1.5, "y": 0.5}, "2026-01-03")  # x regressed
    loaded = db.load_reports([tmp_path])
    assert set(loaded.runs["profile"]) == {"cpu-x-t2"} and set(loaded.runs["isa_profile"]) == {"cpu-avx2"}
    stacks = db.stacks_view(loaded)
    assert list(stacks.columns) == [
        "suite",
        "torch 2.13.0+cpu / cpu-x-t2",
        "torch 2.14.1+cu130 / cpu-x-t2 (vs torch 2.13.0+cpu)",
    ]
    [row] = stacks.to_dict("records")
    assert row["torch 2.13.0+cpu / cpu-x-t2"] == "reference"
    assert (
        row["torch 2.14.1+cu130 / cpu-x-t2 (vs torch 2.13.0+cpu)"] == "1 regressed, 1 changed"
    )  # the check, its value
    assert "cpu-x-t2" in db.pass_fail_matrix(loaded.rows, loaded.runs).columns


def test_largest_changes_lists_only_changes(tmp_path):
    for i in range(3):
        _stack_run(tmp_path, f"r{i}", "2.13.0+cpu", {"x": 0.5, "y": 0.25}, f"2026-01-0{i + 1}")
    loaded = db.load_reports([tmp_path])
    assert db.largest_changes(db.series(loaded.rows, loaded.runs)).empty
    assert "none: no comparable metric changed" in db.render(loaded)


# -- drill-down, in a real browser ------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NODE = "suites/training/test_mine.py::test_my_model[cpu]"


def _drill_run(root: Path, name: str, started: str, result: str, verdict: str, message: str) -> Path:
    rows = [
        rp.make_row(
            run_id=name, nodeid=NODE, suite="training", check="test_my_model", metric=metric, value=value,
            outcome=outcome, allowance=2.0, note=note,
        ).as_dict()
        for metric, value, outcome, note in (
            ("my_model.fp16+scaler.worst_diff_over_allowance", 0.01, "pass", "parity"),
            ("my_model.fp16+scaler.amp_lane_error_ratio", 1.06, verdict, "the lane cannot see fp16 without scaling"),
        )
    ]  # fmt: skip
    test = {"nodeid": NODE, "suite": "training", "result": result, "duration_s": 1.0, "message": message}
    meta = {
        "fingerprint": {"cpu_class": {"id": "cpu-x-t2"}},
        "primary_device": "cpu",
        "started": started,
        "test_results": [{**test, "verdict": verdict}],
    }
    return rp.write(root, name, rows, meta)


def _dump_dom(page: Path, anchor: str) -> str:
    import subprocess

    assert CHROMIUM is not None
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", f"{page.as_uri()}#{anchor}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is missing: the system package `chromium` (CI installs it)")
def test_a_suite_cell_drills_down_to_its_failing_tests_and_rows_in_a_real_browser(tmp_path):
    """The matrix cell of the latest run links to its drill-down; followed in Chromium, the
    drill-down opens on the inconclusive test with its message and its rows; the runs x suites grid
    shows the earlier passing run beside it."""
    import re

    _drill_run(tmp_path, "r1", "2026-01-01", "passed", "pass", "")
    _drill_run(tmp_path, "r2", "2026-01-02", "failed", "inconclusive", "AssertionError: lane INCONCLUSIVE on my_model")
    page = tmp_path / "dashboard.html"
    db.write_dashboard([tmp_path], page)
    text = page.read_text()
    grid = db.runs_by_suites(db.load_reports([tmp_path]))
    assert grid["training"].tolist() == ["PASS", "INCONCLUSIVE"]
    anchor = db.cell_id("training", "r2")
    assert f"<a href='#{anchor}'>INCONCLUSIVE</a>" in text  # the matrix cell (and the grid's) link there
    dom = _dump_dom(page, anchor)
    opened = re.search(rf"<details id=\"{re.escape(anchor)}\"[^>]*\bopen\b.*?</details>", dom, re.S)
    assert opened, f"the drill-down did not open on following the cell's link:\n{dom[:3000]}"
    section = opened.group(0)
    assert "INCONCLUSIVE" in section and "AssertionError: lane INCONCLUSIVE on my_model" in section
    assert "my_model.fp16+scaler.amp_lane_error_ratio" in section and NODE in section
    closed = re.search(rf"<details id=\"{re.escape(db.cell_id('training', 'r1'))}\"[^>]*>", dom)
    assert closed and " open" not in closed.group(0)  # only the followed cell opens
