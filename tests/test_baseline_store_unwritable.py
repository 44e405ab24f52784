"""A baseline store that cannot be written fails the checks that needed it, never the session.

A fleet keeps its baselines on a read-only share; a disk fills up; two sessions regenerate the
same baseline. In each case the checks that had to write fail naming the path and the reason,
every other check keeps its verdict, the run report is written with every row and the terminal
summary is printed.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.storage import atomic
from harness.storage import baselines as bl
from harness.storage import report as rp

TEST_FILE = """
import os
from harness.storage.baselines import KeyKind

VALUE = int(os.environ.get("AMP_DEMO_VALUE", "1"))

def test_kept(amp_baseline):
    amp_baseline.check("kept", {"x": 1}, key=KeyKind.UNIVERSAL)

def test_drifted(amp_baseline):
    amp_baseline.check("drifted", {"x": VALUE}, key=KeyKind.UNIVERSAL)

def test_new(amp_baseline):
    if VALUE > 1:
        amp_baseline.check("new", {"x": VALUE}, key=KeyKind.UNIVERSAL)

def test_measured(amp_record):
    amp_record("unrelated.measurement", 1.0, unit="s")
"""
ARGS = ("-p", "no:cacheprovider", "-W", "ignore::pytest.PytestAssertRewriteWarning", "-rf")
BASE = Path("baselines") / "demo" / "any"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project whose three baselines are stored (kept, drifted; new is not yet)."""
    pytester.makepyfile(test_demo=TEST_FILE)
    monkeypatch.setenv("AMP_DEMO_VALUE", "1")
    pytester.runpytest(*ARGS, "--amp-accept-all", "--amp-no-report").assert_outcomes(passed=4)
    monkeypatch.setenv("AMP_DEMO_VALUE", "2")
    return pytester


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _make_unwritable(directory: Path) -> None:
    """Read-only as a fleet's share is: chmod for a non-root user; as root (whom permissions do
    not stop) the immutable attribute. Skips, saying why, where neither can be had."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return
    if shutil.which("chattr") is None:
        pytest.skip("running as root and chattr is missing: no way to make a directory unwritable here")
    done = subprocess.run(["chattr", "+i", str(directory)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"running as root and chattr +i failed on this file system: {done.stderr.strip()}")


def _make_writable(directory: Path) -> None:
    if os.geteuid() != 0:
        directory.chmod(0o755)
    else:
        subprocess.run(["chattr", "-i", str(directory)], check=False)


def _assert_only_the_writing_checks_failed(result: pytest.RunResult, reason: str, report_dir: Path) -> None:
    __tracebackhide__ = True
    failed = {r.nodeid for r in result.reprec.getfailures()}  # type: ignore[attr-defined]
    assert failed == {"test_demo.py::test_drifted", "test_demo.py::test_new"}, failed
    passed = {r.nodeid for r in result.reprec.getreports("pytest_runtest_logreport") if r.passed and r.when == "call"}  # type: ignore[attr-defined]
    assert passed == {"test_demo.py::test_kept", "test_demo.py::test_measured"}, passed
    text = result.stdout.str()
    assert f"the baseline {BASE / 'new.json'} could not be written: {reason}" in text
    assert f"the obtained file {BASE / 'drifted.obtained.json'} could not be written: {reason}" in text
    # the diff is still shown; no message claims a write that did not happen
    assert "x: expected 1, got 2" in text
    assert "Obtained values:" not in text and "It is written from this run" not in text
    result.stdout.fnmatch_lines(["*- amp-harness -*", "run report: * rows*"])
    (run,) = [d for d in report_dir.iterdir() if not d.name.startswith(".")]
    loaded = rp.load(run)
    assert set(loaded.rows["nodeid"]) == {f"test_demo.py::test_{n}" for n in ("kept", "drifted", "new", "measured")}
    assert set(loaded.rows.loc[loaded.rows["nodeid"] == "test_demo.py::test_new", "outcome"]) == {"fail"}


def test_an_unwritable_baseline_directory_fails_only_the_checks_that_write_and_keeps_the_report(project):
    store = project.path / BASE
    before = _snapshot(project.path / "baselines")
    _make_unwritable(store)
    try:
        result = project.runpytest(*ARGS, f"--amp-report-dir={project.path / 'out'}")
    finally:
        _make_writable(store)
    reason = "Permission denied (EACCES)" if os.geteuid() != 0 else "Operation not permitted (EPERM)"
    _assert_only_the_writing_checks_failed(result, reason, project.path / "out")
    assert _snapshot(project.path / "baselines") == before


def test_a_full_disk_fails_only_the_checks_that_write_and_keeps_the_report(project, monkeypatch):
    before = _snapshot(project.path / "baselines")

    def disk_full(fh: object, text: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_write", disk_full)  # every staged write; the report's own files are not staged
    result = project.runpytest(*ARGS, f"--amp-report-dir={project.path / 'out'}")
    _assert_only_the_writing_checks_failed(result, "No space left on device (ENOSPC)", project.path / "out")
    assert _snapshot(project.path / "baselines") == before
    assert not [p for p in (project.path / "baselines").rglob(".*.tmp")], "a staged file was left behind"


def test_a_rename_that_fails_at_the_end_fails_the_session_and_says_what_was_not_written(project, monkeypatch):
    def refuse(staged: Path, path: Path) -> None:
        staged.unlink()
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(atomic, "commit", refuse)
    result = project.runpytest(*ARGS, "--amp-accept-all", f"--amp-report-dir={project.path / 'out'}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*NOT WRITTEN (2): the session fails; nothing else was lost",
            f"*{BASE / 'drifted.json'}: Read-only file system (EROFS)",
            f"*{BASE / 'new.json'}: Read-only file system (EROFS)",
            "run report: 4 rows*",
        ],
        consecutive=False,
    )
    (run,) = [d for d in (project.path / "out").iterdir() if not d.name.startswith(".")]
    meta = json.loads((run / rp.RUN_JSON).read_text())
    assert [e["reason"] for e in meta["write_errors"]] == ["Read-only file system (EROFS)"] * 2


def test_a_candidates_directory_takes_every_write_and_the_baselines_stay_untouched(project):
    before = _snapshot(project.path / "baselines")
    cand = project.path / "candidates"
    result = project.runpytest(*ARGS, "--amp-no-report", f"--amp-candidates-dir={cand}")
    result.assert_outcomes(failed=2, passed=2)
    assert _snapshot(project.path / "baselines") == before
    assert sorted(_snapshot(cand)) == ["demo/any/drifted.obtained.json", "demo/any/new.json"]
    assert "candidates/demo/any/new.json" in result.stdout.str()
    regen = project.runpytest(*ARGS, "--amp-no-report", f"--amp-candidates-dir={cand}", "--amp-regen")
    assert _snapshot(project.path / "baselines") == before
    assert json.loads((cand / "demo/any/drifted.json").read_text())["data"] == {"x": 2}
    regen.stdout.fnmatch_lines(["*regenerated; review the diff and commit it into the candidates directory*"])


def test_a_candidates_directory_that_is_the_baseline_directory_is_a_usage_error(project):
    result = project.runpytest(*ARGS, f"--amp-candidates-dir={project.path / 'baselines'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-candidates-dir=*: it is the baseline directory itself*"])


WRITER = """
import sys
from pathlib import Path
from harness.storage import baselines as bl
store = bl.BaselineStore(Path(sys.argv[1]))
path = store.path_for("s", "any", "n")
for i in range(int(sys.argv[3])):
    doc = bl.BaselineDocument("s", "n", "any", "universal", {"writer": sys.argv[2], "i": i, "pad": "x" * 4096}, {})
    store.queue_write(path, doc)
    store.flush()
assert not store.errors, store.errors
"""


def test_two_sessions_writing_the_same_baseline_at_once_leave_one_whole_file(tmp_path):
    """Each write is staged and renamed: a reader sees one writer's whole file, never a mix."""
    rounds = 200
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), name, str(rounds)]) for name in ("a", "b")
    ]
    path = bl.BaselineStore(tmp_path).path_for("s", "any", "n")
    reads = 0
    while any(w.poll() is None for w in writers):
        if path.exists():
            doc = bl.Serializer().loads(path.read_text(), path, "")  # raises on a torn file
            assert doc.data["writer"] in ("a", "b")
            reads += 1
    assert [w.returncode for w in writers] == [0, 0]
    final = bl.Serializer().loads(path.read_text(), path, "")
    assert final.data["i"] == rounds - 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["n.json"], "a staged file was left behind"
    assert reads > 0


@pytest.fixture
def full_disk(tmp_path):
    """A file system with no space left: a 64 KiB tmpfs, filled. Needs root and mount; skips, saying
    why, where the machine does not allow it (the simulated ENOSPC above runs everywhere)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs root and mount (tmpfs)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not allowed here: {done.stderr.strip()}")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_really_full_disk_fails_the_check_that_writes_and_leaves_nothing_behind(project, full_disk):
    root = full_disk / "baselines"
    root.mkdir()
    result = project.runpytest(*ARGS, f"--amp-baseline-dir={root}", f"--amp-report-dir={project.path / 'out'}")
    failed = {r.nodeid for r in result.reprec.getfailures()}  # type: ignore[attr-defined]
    assert failed == {f"test_demo.py::test_{n}" for n in ("kept", "drifted", "new")}, failed  # all three must write
    assert "No space left on device (ENOSPC)" in result.stdout.str()
    assert [p.name for p in root.rglob("*") if p.is_file()] == []
    assert [d for d in (project.path / "out").iterdir() if not d.name.startswith(".")]
