"""The fleet dataset: publishing runs into hive partitions, reading only what a view needs, and the
dashboard and diff over it (the 10,000-run figure is benchmarks/fleet_10k.py's, not a test's)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pytest

from harness.apps.cli import main
from harness.storage import fleet
from harness.storage import report as rp


def _run(root: Path, run_id: str, torch: str, cls: str, value: float, started: str) -> Path:
    row = rp.make_row(
        run_id=run_id, nodeid="suites/s/test_s.py::test_x[cpu]", suite="s", check="test_x", metric="x",
        value=value, outcome="pass" if value < 1 else "fail",
    ).as_dict()  # fmt: skip
    meta = {
        "started": started,
        "primary_device": "cpu",
        "fingerprint": {"torch_version": torch, "cpu_class": {"id": cls}},
    }
    return rp.write(root, run_id, [row], meta)


@pytest.fixture
def published(tmp_path: Path) -> Path:
    reports, root = tmp_path / "reports", tmp_path / "fleet"
    _run(reports, "20261101T000000Z-000001", "2.13.0+cpu", "cpu-a-t2", 0.5, "2026-11-01T00:00:00+00:00")
    _run(reports, "20261102T000000Z-000002", "2.13.0+cpu", "cpu-a-t2", 0.5, "2026-11-02T00:00:00+00:00")
    _run(reports, "20261103T000000Z-000003", "2.14.1+cu130", "cpu-a-t2", 1.5, "2026-11-03T00:00:00+00:00")
    _run(reports, "20261103T000000Z-000004", "2.13.0+cpu", "cpu-b-t2", 0.5, "2026-11-03T00:00:00+00:00")
    assert main(["publish", str(reports), "--fleet", str(root)]) == 0
    return root


def test_runs_land_in_class_stack_and_date_partitions_and_nothing_half_written(published):
    files = sorted(p.relative_to(published).as_posix() for p in published.rglob("*") if p.is_file())
    assert "hardware_class=cpu-a-t2/stack=torch-2.14/date=2026-11-03/20261103T000000Z-000003.parquet" in files
    assert len(files) == 4 and not any(Path(f).name.startswith(".") for f in files)
    # the layout is a hive dataset pyarrow reads as one table, partition columns included
    table = ds.dataset(published, format="parquet", partitioning="hive").to_table(columns=["run_id", "stack"])
    assert sorted(set(table.column("stack").to_pylist())) == ["torch-2.13", "torch-2.14"]


def test_select_takes_the_latest_matching_run_and_load_restores_its_metadata(published):
    runs = fleet.index(published)
    run = fleet.select(runs, "stack=torch-2.13,hardware_class=cpu-a")
    assert run.run_id == "20261102T000000Z-000002"
    loaded = fleet.load(run)
    assert loaded.meta["fingerprint"]["torch_version"] == "2.13.0+cpu" and len(loaded.rows) == 1
    with pytest.raises(ValueError, match="unknown selector key 'gpu'"):
        fleet.select(runs, "gpu=h200")
    with pytest.raises(ValueError, match="no published run matches"):
        fleet.select(runs, "stack=torch-9.9")


def test_latest_keeps_a_window_per_class_and_stack(published):
    kept = fleet.latest(fleet.index(published), per_class=1)
    assert [r.run_id[-6:] for r in kept] == ["000002", "000003", "000004"]


def test_diff_and_dashboard_read_the_fleet(published, tmp_path, capsys):
    code = main(["diff", "--fleet", str(published), "stack=torch-2.13,hardware_class=cpu-a", "stack=torch-2.14"])
    assert code == 1  # test_x passed on 2.13 and fails on 2.14
    assert "regressed  check" in capsys.readouterr().out
    assert main(["diff", "--fleet", str(published), "stack=torch-2.13", "nowhere=1"]) == 2
    assert "amp-harness diff: B: unknown selector key 'nowhere'" in capsys.readouterr().err
    out = tmp_path / "dash.html"
    assert main(["dashboard", "--fleet", str(published), "-o", str(out)]) == 0
    html = out.read_text()
    assert (
        "Drawn from a fleet dataset of 4 runs" in html and "torch 2.14.1+cu130 / cpu-a-t2 (vs torch 2.13.0+cpu)" in html
    )


def test_publish_and_dashboard_name_what_they_cannot_use(tmp_path, capsys):
    assert main(["publish", str(tmp_path), "--fleet", str(tmp_path / "f")]) == 2
    assert "no run report here" in capsys.readouterr().err
    assert main(["dashboard", "--fleet", str(tmp_path / "missing"), "-o", str(tmp_path / "d.html")]) == 2
    assert "no fleet dataset here" in capsys.readouterr().err


def test_a_file_url_is_the_same_fleet_as_its_directory(published, tmp_path, capsys):
    url = published.as_uri()  # file:///...
    assert [r.run_id for r in fleet.index(url)] == [r.run_id for r in fleet.index(published)]
    args = ["stack=torch-2.13,hardware_class=cpu-a", "stack=torch-2.14"]
    assert main(["diff", "--fleet", url, *args]) == 1
    by_url = capsys.readouterr().out
    assert main(["diff", "--fleet", str(published), *args]) == 1
    assert by_url == capsys.readouterr().out
    more = tmp_path / "more"
    _run(more, "20261104T000000Z-000005", "2.13.0+cpu", "cpu-a-t2", 0.5, "2026-11-04T00:00:00+00:00")
    assert main(["publish", str(more), "--fleet", url]) == 0
    assert len(fleet.index(published)) == 5
