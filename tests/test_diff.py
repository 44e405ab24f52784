"""``amp-harness diff``: every status, the policy and known-issue views, the formats, the width, the
exit status, and bad input, on run reports written by the harness's own report writer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.apps import diff as df
from harness.apps.cli import main
from harness.numerics.verdict import RowKind
from harness.storage import report as rp


def _row(suite: str, test: str, metric: str, value: float | None, outcome: str = "pass", **kw: Any) -> dict[str, Any]:
    return rp.make_row(
        run_id="r", nodeid=f"suites/{suite}/test_x.py::{test}", suite=suite, check=test.split("[")[0], metric=metric,
        value=value, outcome=outcome, **kw,
    ).as_dict()  # fmt: skip


def _run(root: Path, name: str, rows: list[dict[str, Any]], torch: str = "2.13.0+cpu") -> Path:
    meta = {
        "fingerprint": {"torch_version": torch, "cpu_class": {"id": "cpu-test-class-t2"}},
        "git_commit": "0123456789abcdef",
        "primary_device": "cpu",
        "profile": "cpu-avx2",
    }
    return rp.write(root, name, [{**r, "run_id": name} for r in rows], meta)


def _policy(op: str, category: str) -> dict[str, Any]:
    return _row("autocast", "test_policy[cpu-bf16]", f"policy.{op}", None, "info", dtype="bfloat16", device="cpu",
                tags={"category": category}, kind=RowKind.POLICY)  # fmt: skip


def _known(issue: str, outcome: str) -> dict[str, Any]:
    return _row("compiled", f"test_known[{issue}]", f"known_issue.{issue}", 1.0, outcome, kind=RowKind.KNOWN_ISSUE)


BASE = [
    _row("numerics", "test_a[cpu]", "mm.error_over_budget", 0.5),
    _row("numerics", "test_b[cpu]", "sum.error_over_budget", 0.25),
    _row("numerics", "test_c[cpu]", "exp.error_over_budget", 1.5, "fail"),
    _row("numerics", "test_d[cpu]", "log.error_over_budget", 0.1),
    _row("numerics", "test_stat[cpu]", "loss.distance", 1.0, drift=0.1),
    _row("speed", "test_speed[cpu]", "matmul.speedup", 2.0, "pass", kind=RowKind.SPEEDUP),
    _policy("torch.mm", "lower_precision"),
    _policy("torch.softmax", "fp32"),
    _known("issue-one", "known"),
    _known("issue-two", "pass"),
]


def _b_rows() -> list[dict[str, Any]]:
    rows = [dict(r) for r in BASE]
    rows[0] = _row("numerics", "test_a[cpu]", "mm.error_over_budget", 1.7, "fail")  # regressed
    rows[2] = _row("numerics", "test_c[cpu]", "exp.error_over_budget", 0.9)  # improved
    del rows[3]  # test_d missing
    rows.append(_row("numerics", "test_e[cpu]", "pow.error_over_budget", 0.3))  # new
    rows[3] = _row("numerics", "test_stat[cpu]", "loss.distance", 1.05, drift=0.1)  # within its drift
    rows[4] = _row("speed", "test_speed[cpu]", "matmul.speedup", 1.2, "pass", kind=RowKind.SPEEDUP)  # 1.67x slower
    rows[5] = _policy("torch.mm", "fp32")  # a policy cell changed
    rows[7] = _known("issue-one", "pass")  # a known issue disappeared
    rows[8] = _known("issue-two", "known")  # another appeared
    return rows


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    return _run(tmp_path / "a", "run-a", BASE), _run(tmp_path / "b", "run-b", _b_rows(), torch="2.14.1+cpu")


def _by_name(d: df.Diff) -> dict[tuple[str, str], df.Change]:
    return {(c.kind, c.name): c for c in d.changes}


def test_each_kind_of_change_gets_its_status(runs):
    a, b = runs
    got = _by_name(df.diff(df.load_side("A", a), df.load_side("B", b)))
    assert got[("check", "test_a[cpu]")].status is df.Status.REGRESSED
    assert got[("check", "test_c[cpu]")].status is df.Status.IMPROVED
    assert got[("check", "test_d[cpu]")].status is df.Status.MISSING
    assert got[("check", "test_e[cpu]")].status is df.Status.NEW
    assert got[("check", "test_b[cpu]")].status is df.Status.UNCHANGED
    # a deterministic metric (drift 0) changed; a statistic within its drift did not
    assert got[("metric", "mm.error_over_budget")].status is df.Status.CHANGED
    assert (got[("metric", "mm.error_over_budget")].a, got[("metric", "mm.error_over_budget")].b) == ("0.5", "1.7")
    assert got[("metric", "loss.distance")].status is df.Status.UNCHANGED
    assert got[("speed", "matmul.speedup")].status is df.Status.CHANGED
    cell = got[("policy", "torch.mm bfloat16 cpu")]
    assert (
        cell.status is df.Status.CHANGED
        and cell.detail == "torch.mm bfloat16 cpu: A gives lower_precision, B gives fp32"
    )
    assert got[("policy", "torch.softmax bfloat16 cpu")].status is df.Status.UNCHANGED
    assert got[("known", "issue-one")].detail == "A: present, B: absent"
    assert got[("known", "issue-two")].detail == "A: absent, B: present"


def test_a_speedup_judged_against_nothing_is_not_compared_and_is_counted(tmp_path):
    """A case calibration never judges (layer_norm, kept in fp32 by autocast: its ratio is noise)
    moving 0.63 -> 1.00 is not "changed beyond the speed rule's detectable 1.3x"."""
    a = _run(
        tmp_path / "a",
        "a",
        [_row("speed", "test_speed[cpu]", "layer_norm.speedup", 0.63, "unjudged", kind=RowKind.SPEEDUP)],
    )
    b = _run(
        tmp_path / "b",
        "b",
        [_row("speed", "test_speed[cpu]", "layer_norm.speedup", 1.00, "unjudged", kind=RowKind.SPEEDUP)],
    )
    d = df.diff(df.load_side("A", a), df.load_side("B", b))
    assert not [c for c in d.changes if c.kind == "speed"], d.changes
    assert d.speed_not_compared == 1 and "1 speedups not compared" in d.summary()


def test_kinds_come_from_the_kind_column_and_older_reports_from_the_metric_name(tmp_path):
    """A measurement whose name merely looks like a policy cell is not one; a report written before
    the kind column (its rows without it) still reads its policy cells, known issues and speedups."""
    odd = _run(tmp_path / "a", "a", [_row("autocast", "test_p[cpu]", "policy.looks_like_a_cell", 1.0)])
    assert set(rp.load(odd).rows["kind"]) == {"measurement"}
    old = _run(tmp_path / "b", "b", [_policy("torch.mm", "fp32"), _known("issue-one", "known")])
    rows = pd.read_parquet(old / rp.ROWS_PARQUET).drop(columns=["kind"])
    rows.to_parquet(old / rp.ROWS_PARQUET, index=False)
    assert rp.load(old).rows["kind"].tolist() == ["policy", "known_issue"]


def test_a_statistic_beyond_its_drift_is_changed(tmp_path):
    a = _run(tmp_path / "a", "a", [_row("t", "test_s", "loss.distance", 1.0, drift=0.1)])
    b = _run(tmp_path / "b", "b", [_row("t", "test_s", "loss.distance", 1.2, drift=0.1)])
    [change] = [c for c in df.diff(df.load_side("A", a), df.load_side("B", b)).changes if c.kind == "metric"]
    assert change.status is df.Status.CHANGED and change.detail == "drift 0.1"


def test_the_text_table_is_grouped_by_suite_and_fits_100_columns(runs, capsys):
    a, b = runs
    assert main(["diff", str(a), str(b)]) == 1  # B regressed
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= df.WIDTH
    assert "A: run run-a, torch 2.13.0+cpu, commit 01234567" in out and "class cpu-test-class-t2" in out
    assert "summary: 1 regressed, 1 improved, 2 new, 2 missing," in out  # a check and its metric each
    for suite in ("numerics:", "autocast:", "compiled:", "speed:"):
        assert any(line.startswith(suite) for line in out.splitlines()), suite
    assert "torch.mm bfloat16 cpu: A gives lower_precision, B gives fp32" in out


def test_exit_status_is_0_without_a_regression_even_when_things_changed(tmp_path):
    rows = [dict(r) for r in BASE]
    b_rows = [
        *rows[:5],
        _row("speed", "test_speed[cpu]", "matmul.speedup", 9.0, "pass", kind=RowKind.SPEEDUP),
        *rows[6:],
    ]
    a, b = _run(tmp_path / "a", "a", rows), _run(tmp_path / "b", "b", b_rows)
    assert main(["diff", str(a), str(b)]) == 0
    assert main(["compare", str(a), str(a)]) == 0  # the old command's name is an alias


@pytest.mark.parametrize("fmt", ["md", "csv", "html"])
def test_the_formats_carry_the_same_entries(runs, tmp_path, fmt):
    a, b = runs
    out = tmp_path / f"diff.{fmt}"
    assert main(["diff", str(a), str(b), "--format", fmt, "-o", str(out)]) == 1
    text = out.read_text()
    if fmt == "csv":
        table = pd.read_csv(out)
        assert list(table.columns) == list(df.COLUMNS)
        assert set(table["status"]) == {s.value for s in df.Status}  # unchanged entries included
    elif fmt == "md":
        assert "| regressed | check | `test_a[cpu]` | PASS | FAIL |" in text
    else:
        assert "<tr class='regressed'><td>regressed</td><td>check</td><td>test_a[cpu]</td>" in text


def test_suites_only_one_side_ran_are_named_and_skipped(tmp_path, capsys):
    a = _run(tmp_path / "a", "a", [_row("formats", "test_f", "m", 1.0), _row("fp8", "test_g", "m", 1.0)])
    b = _run(tmp_path / "b", "b", [_row("formats", "test_f", "m", 1.0), _row("memory", "test_h", "m", 1.0)])
    assert main(["diff", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "skipped: suite 'fp8' is only in A" in out and "skipped: suite 'memory' is only in B" in out
    assert "0 new, 0 missing" in out


def test_a_report_directory_gives_its_latest_run(tmp_path):
    root = tmp_path / "reports"
    _run(root, "20260101T000000Z-aaaaaa", BASE)
    _run(root, "20260102T000000Z-bbbbbb", _b_rows())
    assert df.load_side("A", root).run_id == "20260102T000000Z-bbbbbb"


def _corrupt(tmp_path: Path) -> Path:
    run = _run(tmp_path / "c", "corrupt", BASE)
    (run / rp.ROWS_PARQUET).write_bytes(b"not parquet")
    return run


def _newer(tmp_path: Path) -> Path:
    run = _run(tmp_path / "n", "newer", BASE)
    meta = json.loads((run / rp.RUN_JSON).read_text())
    (run / rp.RUN_JSON).write_text(json.dumps({**meta, "schema_version": rp.SCHEMA_VERSION + 1}))
    return run


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p / "nowhere", "does not exist"),
        (lambda p: p, "holds no run report"),
        (_corrupt, "unreadable parquet"),
        (_newer, "is newer than this harness reads"),
        (lambda p: _run(p / "e", "empty", []), "has no rows (an empty run)"),
    ],
    ids=["missing", "not-a-report", "corrupt", "newer-schema", "empty"],
)
def test_bad_input_is_a_usage_error_naming_the_side_and_the_path(runs, tmp_path, capsys, make, message):
    a, _ = runs
    bad = make(tmp_path)
    assert main(["diff", str(a), str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("amp-harness diff: B: ") and message in err
