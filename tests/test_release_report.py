"""``amp-harness release``: the release report decided from two run reports (the new release's and
the reference's), on reports written by the harness's own report writer; and its command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.apps import diff as df
from harness.apps import release as rel
from harness.apps.cli import main
from harness.numerics.verdict import RowKind
from harness.storage import report as rp


def _row(suite: str, test: str, metric: str, value: float | None, outcome: str = "pass", **kw: Any) -> dict[str, Any]:
    return rp.make_row(
        run_id="r", nodeid=f"suites/{suite}/test_x.py::{test}", suite=suite, check=test.split("[")[0], metric=metric,
        value=value, outcome=outcome, **kw,
    ).as_dict()  # fmt: skip


def _run(root: Path, name: str, rows: list[dict[str, Any]], torch: str, failed: tuple[str, ...] = ()) -> Path:
    tests = sorted({str(r["nodeid"]) for r in rows})
    meta = {
        "fingerprint": {"torch_version": torch, "cpu_class": {"id": "cpu-test-class-t2"}},
        "primary_device": "cpu",
        "test_results": [
            {"nodeid": t, "suite": t.split("/")[1], "result": "failed" if t in failed else "passed",
             "duration_s": 0.1, "message": "AssertionError: it broke" if t in failed else "",
             "verdict": "fail" if t in failed else "pass"}
            for t in tests
        ],
    }  # fmt: skip
    return rp.write(root, name, [{**r, "run_id": name} for r in rows], meta)


def _known(issue: str, outcome: str, lifecycle: str, state: str = "present") -> dict[str, Any]:
    return _row("scaler", f"test_known[{issue}]", f"known_issue.{issue}", 1.0, outcome, kind=RowKind.KNOWN_ISSUE,
                tags={"lifecycle": lifecycle, "lifecycle_state": state})  # fmt: skip


def _policy(op: str, category: str) -> dict[str, Any]:
    return _row("autocast", "test_lists[cpu-bf16]", f"policy.{op}", None, "info", dtype="bfloat16", device="cpu",
                tags={"category": category}, kind=RowKind.POLICY)  # fmt: skip


def _baseline(name: str, status: str, outcome: str = "pass") -> dict[str, Any]:
    return _row("formats", f"test_{name}[cpu]", f"baseline.{name}", 0, outcome,
                tags={"baseline": f"baselines/formats/torch-2.15/{name}.json", "status": status},
                note=f"Baseline baselines/formats/torch-2.15/{name}.json does not exist: ...")  # fmt: skip


REFERENCE = [
    _known("update-int-new-scale", "known", "present"),
    _known("gone-now", "known", "present"),
    _policy("torch.qr", "fp32"),
    _baseline("fp8_casts_cpu", "matched"),
]


def _candidate() -> list[dict[str, Any]]:
    still = "known issue update-int-new-scale is still present in torch 2.15.0"
    gone = "known issue gone-now did not occur in torch 2.15.0: fixed in 2.15? set fixed='2.15'"
    return [
        _known("update-int-new-scale", "known", still, "still present"),
        _known("gone-now", "pass", gone, "fixed?"),
        _policy("torch.qr", "raises"),
        _baseline("fp8_casts_cpu", "matched another release"),
    ]


def test_a_release_that_changed_only_behaviour_and_known_issues_passes_and_lists_them(tmp_path):
    a = _run(tmp_path / "a", "ref", REFERENCE, "2.14.1+cpu")
    b = _run(tmp_path / "b", "cand", _candidate(), "2.15.0+cu132")
    report = rel.release_report(df.load_side("A", a), df.load_side("B", b))
    assert report.exit_code == 0 and not report.failures
    assert {k.id: k.category for k in report.known} == {"update-int-new-scale": "still present", "gone-now": "fixed?"}
    assert report.adopt == [
        ("baselines/formats/torch-2.15/fp8_casts_cpu.json", "suites/formats/test_x.py::test_fp8_casts_cpu[cpu]")
    ]
    text = rel.render(report)
    for words in ("release report: PASS (exit 0)", "changed   autocast/policy torch.qr bfloat16 cpu: fp32 -> raises",
                  "still present:", "fixed?:", "--amp-regen"):  # fmt: skip
        assert words in text, text


def test_a_failed_check_or_a_baseline_changed_since_the_earlier_release_fails_the_release(tmp_path):
    a = _run(tmp_path / "a", "ref", REFERENCE, "2.14.1+cpu")
    rows = [*_candidate()[:3], _baseline("fp8_casts_cpu", "changed since another release", "fail")]
    b = _run(
        tmp_path / "b", "cand", rows, "2.15.0+cu132", failed=("suites/formats/test_x.py::test_fp8_casts_cpu[cpu]",)
    )
    report = rel.release_report(df.load_side("A", a), df.load_side("B", b))
    assert report.exit_code == 1
    assert report.failures == [("suites/formats/test_x.py::test_fp8_casts_cpu[cpu]", "AssertionError: it broke")]
    assert [p for p, _, _ in report.changed_baselines] == ["baselines/formats/torch-2.15/fp8_casts_cpu.json"]


def test_the_command_judges_two_reports_and_says_what_is_missing(tmp_path, capsys):
    a = _run(tmp_path / "a", "ref", REFERENCE, "2.14.1+cpu")
    b = _run(tmp_path / "b", "cand", _candidate(), "2.15.0+cu132")
    out = tmp_path / "release.txt"
    assert main(["release", "--candidate", str(b), "--reference", str(a), "-o", str(out)]) == 0
    assert "release report: PASS" in out.read_text()
    assert main(["release"]) == 2
    assert "give the torch requirement" in capsys.readouterr().err
    assert main(["release", "--candidate", str(tmp_path / "nowhere"), "--reference", str(a)]) == 2


def test_a_known_issue_row_from_before_lifecycle_states_is_placed_by_its_outcome(tmp_path):
    old = [_row("scaler", f"test_known[{i}]", f"known_issue.{i}", 1.0, o, kind=RowKind.KNOWN_ISSUE)
           for i, o in (("a", "known"), ("b", "pass"), ("c", "fail"))]  # fmt: skip
    a = _run(tmp_path / "a", "ref", REFERENCE, "2.14.1+cpu")
    b = _run(tmp_path / "b", "cand", old, "2.15.0+cu132")
    report = rel.release_report(df.load_side("A", a), df.load_side("B", b))
    assert {k.id: k.category for k in report.known} == {
        "a": "present, as registered",
        "b": "absent, as registered",
        "c": "regressed or outside its registered range",
    }
