"""The baseline lifecycle end to end, as a user meets it (pytest-regressions semantics)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.storage import atomic
from harness.storage import baselines as bl

TEST_FILE = """
import json, pathlib
from harness.storage.baselines import KeyKind

def test_demo(amp_baseline):
    value = json.loads(pathlib.Path(__file__).with_name("value.json").read_text())
    amp_baseline.check("demo", value, key=KeyKind.UNIVERSAL)
"""
ARGS = ("-p", "no:cacheprovider", "--amp-no-report", "-W", "ignore::pytest.PytestAssertRewriteWarning")


@pytest.fixture
def demo(pytester: pytest.Pytester):
    pytester.makepyfile(test_demo=TEST_FILE)

    class Demo:
        baseline = pytester.path / "baselines" / "demo" / "any" / "demo.json"
        obtained = pytester.path / "baselines" / "demo" / "any" / "demo.obtained.json"

        def run(self, value: object, *args: str) -> pytest.RunResult:
            (pytester.path / "value.json").write_text(json.dumps(value))
            return pytester.runpytest(*ARGS, *args)

        def stored(self) -> object:
            return json.loads(self.baseline.read_text())["data"]

    return Demo()


def test_missing_baseline_fails_and_is_written_then_passes(demo):
    first = demo.run({"loss": 1.5, "dtype": "bfloat16"})
    first.assert_outcomes(failed=1)
    first.stdout.fnmatch_lines(["*Baseline missing: baselines/demo/any/demo.json*", "*baselines written: 1*"])
    assert demo.stored() == {"loss": 1.5, "dtype": "bfloat16"}
    doc = json.loads(demo.baseline.read_text())
    assert doc["format_version"] == bl.FORMAT_VERSION
    assert {"torch", "device", "profile", "harness", "created", "git_commit", "cuda"} <= doc["provenance"].keys()
    demo.run({"loss": 1.5, "dtype": "bfloat16"}).assert_outcomes(passed=1)


def test_drift_fails_naming_the_file_and_the_regenerate_command_and_leaves_obtained(demo):
    demo.run({"loss": 1.5})
    before = demo.baseline.read_bytes()
    result = demo.run({"loss": 1.75})
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Baseline mismatch: baselines/demo/any/demo.json*",
            "*1 of 1 values differ*",
            "*loss: expected 1.5, got 1.75*",
            "*Obtained values: baselines/demo/any/demo.obtained.json*",
            "*regenerate the baseline: pytest test_demo.py::test_demo --amp-regen*",
        ]
    )
    assert demo.baseline.read_bytes() == before
    assert json.loads(demo.obtained.read_text())["data"] == {"loss": 1.75}


def test_regen_rewrites_and_still_fails_then_passes(demo):
    demo.run({"loss": 1.5})
    demo.run({"loss": 1.75})
    regen = demo.run({"loss": 1.75}, "--amp-regen")
    regen.assert_outcomes(failed=1)
    regen.stdout.fnmatch_lines(["*demo.json regenerated; review the diff and commit it*"])
    assert demo.stored() == {"loss": 1.75}
    assert not demo.obtained.exists()
    demo.run({"loss": 1.75}).assert_outcomes(passed=1)


def test_accept_all_rewrites_and_passes(demo):
    demo.run({"loss": 1.5})
    demo.run({"loss": 2.0}, "--amp-accept-all").assert_outcomes(passed=1)
    assert demo.stored() == {"loss": 2.0}


def test_a_matching_run_removes_a_stale_obtained_file(demo):
    demo.run({"loss": 1.5})
    demo.run({"loss": 1.75})
    assert demo.obtained.exists()
    demo.run({"loss": 1.5}).assert_outcomes(passed=1)
    assert not demo.obtained.exists()


BAD_FILES = {
    "truncated": (lambda text: text[: len(text) // 2], "is corrupt or truncated"),
    "nan": (lambda text: text.replace('"loss": 1.5', '"loss": NaN'), "holds non-finite number NaN"),
    "wrong_version": (
        lambda text: text.replace(f'"format_version": {bl.FORMAT_VERSION}', '"format_version": 99'),
        "has format_version 99, this harness reads version 1",
    ),
    "not_a_baseline": (lambda text: "[1, 2, 3]\n", "is not an amp-harness baseline"),
}


@pytest.mark.parametrize("damage", sorted(BAD_FILES))
def test_an_unreadable_baseline_errors_clearly_and_is_left_untouched(demo, damage):
    demo.run({"loss": 1.5})
    corrupt, problem = BAD_FILES[damage]
    demo.baseline.write_text(corrupt(demo.baseline.read_text()))
    damaged = demo.baseline.read_bytes()
    result = demo.run({"loss": 1.5})
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*demo.json: {problem}*", "*The file was left untouched.*"])
    result.stdout.fnmatch_lines(["*Regenerate*--amp-regen*"])
    assert demo.baseline.read_bytes() == damaged
    assert not demo.obtained.exists()


def test_regen_replaces_an_unreadable_baseline(demo):
    demo.run({"loss": 1.5})
    demo.baseline.write_text("{ truncated")
    demo.run({"loss": 1.5}, "--amp-regen").assert_outcomes(failed=1)
    assert demo.stored() == {"loss": 1.5}
    demo.run({"loss": 1.5}).assert_outcomes(passed=1)


def test_baselines_no_check_used_are_reported_at_session_end(demo):
    demo.run({"loss": 1.5})
    orphan = demo.baseline.with_name("retired_check.json")
    orphan.write_text(demo.baseline.read_text())
    result = demo.run({"loss": 1.5})
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*baselines not used by any collected check*", "*baselines/demo/any/retired_check.json*"]
    )
    assert orphan.exists()


def test_writes_an_interrupted_session_staged_are_reported_and_left_alone(demo):
    """A session killed between staging and renaming (a GPU lease cut at its time limit) leaves
    complete staged files; the next session names them and leaves them for review."""
    demo.run({"loss": 1.5})
    staged = demo.baseline.with_name(f".{demo.baseline.name}.k3x9q2.tmp")
    staged.write_text(demo.baseline.read_text())
    result = demo.run({"loss": 1.5})
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*staged by an interrupted session and never moved into place (1)*", "*.demo.json.k3x9q2.tmp*"]
    )
    assert staged.exists()


def test_non_finite_obtained_data_is_refused_with_advice(demo):
    result = demo.run({"loss": 1.5})
    result = demo.run({"loss": float("inf")})
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*non-finite values at data.loss*record them as strings*"])


def test_regen_and_accept_all_together_is_a_usage_error(demo):
    result = demo.run({"loss": 1.5}, "--amp-regen", "--amp-accept-all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--amp-regen*--amp-accept-all*exclude each other*"])


# -- storage unit tests -------------------------------------------------------------------------
def test_atomic_write_keeps_the_old_file_when_the_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "b.json"
    atomic.write_text(path, "old\n")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic.write_text(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]  # no temporary file left behind


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_atomic_writes_get_the_permissions_of_an_ordinary_file(tmp_path, umask):
    """tempfile would leave 0600 files and 0700 directories: a shared report directory would be
    unreadable to a dashboard job running as another user."""
    old = os.umask(umask)
    try:
        atomic.write_text(tmp_path / "b.json", "x\n")
        with atomic.directory(tmp_path / "run") as d:
            (d / "rows.csv").write_text("x\n")
    finally:
        os.umask(old)
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o777 & ~umask
    assert (tmp_path / "run" / "rows.csv").stat().st_mode & 0o777 == 0o666 & ~umask


def test_writes_are_queued_until_flush(tmp_path):
    store = bl.BaselineStore(tmp_path)
    path = store.path_for("s", "any", "n")
    store.queue_write(path, bl.BaselineDocument("s", "n", "any", "universal", {"x": 1}, {}))
    assert not path.exists()
    assert store.flush() == [path]
    assert json.loads(path.read_text())["data"] == {"x": 1}


@pytest.mark.parametrize("bad", ["", "../escape", ".hidden", "a/b"])
def test_baseline_names_cannot_escape_the_store(tmp_path, bad):
    with pytest.raises(ValueError, match="plain, non-hidden file name"):
        bl.BaselineStore(tmp_path).path_for("suite", "any", bad)


def test_keys_per_kind():
    assert bl.key_for(bl.KeyKind.UNIVERSAL, "cpu-avx2", "torch-2.13") == "any"
    assert bl.key_for(bl.KeyKind.STACK, "cpu-avx2", "torch-2.13") == "torch-2.13"
    assert bl.key_for(bl.KeyKind.PROFILE, "cpu-avx2", "torch-2.13") == "cpu-avx2"
    assert bl.key_for(bl.KeyKind.PROFILE_STACK, "nvidia-h200", "torch-2.13") == "nvidia-h200__torch-2.13"


def test_a_baseline_copied_to_another_key_is_detected(tmp_path):
    store = bl.BaselineStore(tmp_path)
    src = store.path_for("s", "torch-2.12", "n")
    store.queue_write(src, bl.BaselineDocument("s", "n", "torch-2.12", "stack", {"x": 1}, {}))
    store.flush()
    dst = store.path_for("s", "torch-2.13", "n")
    dst.parent.mkdir(parents=True)
    dst.write_text(src.read_text())
    out = bl.check(
        store,
        suite="s",
        name="n",
        key="torch-2.13",
        key_kind=bl.KeyKind.STACK,
        data={"x": 1},
        provenance={},
        mode=bl.Mode.CHECK,
        regen_command="pytest x --amp-regen",
    )
    assert not out.passed
    assert "belongs to s/torch-2.12/n" in out.message
    assert Path(dst).read_text() == src.read_text()


# -- a release with no baselines of its own: judged against the nearest other release ------------
def _stack_store(tmp_path: Path, releases: dict[str, object]) -> bl.BaselineStore:
    store = bl.BaselineStore(tmp_path)
    for key, data in releases.items():
        store.queue_write(
            store.path_for("s", key, "n"), bl.BaselineDocument("s", "n", key, "stack", data, {"torch": key})
        )
    store.flush()
    return store


def _check_stack(store: bl.BaselineStore, key: str, data: object, mode: bl.Mode = bl.Mode.CHECK) -> bl.BaselineResult:
    out = bl.check(
        store,
        suite="s",
        name="n",
        key=key,
        key_kind=bl.KeyKind.STACK,
        data=data,
        provenance={"torch": key},
        mode=mode,
        regen_command="pytest x --amp-regen",
    )
    store.flush()
    return out


def test_a_new_release_that_behaves_like_the_last_passes_naming_the_baseline_it_was_judged_against(tmp_path):
    store = _stack_store(tmp_path, {"torch-2.13": {"x": 0}, "torch-2.14": {"x": 1}})
    out = _check_stack(store, "torch-2.15", {"x": 1})
    assert out.passed and out.status is bl.Status.INHERITED
    assert "torch-2.14/n.json" in out.message and "pytest x --amp-regen" in out.message
    assert not store.path_for("s", "torch-2.15", "n").exists(), "a check never writes the new release's baseline"
    assert store.path_for("s", "torch-2.14", "n") in store.used


def test_a_new_release_that_differs_fails_with_the_difference_and_leaves_its_obtained_file(tmp_path):
    store = _stack_store(tmp_path, {"torch-2.13": {"x": 1}, "torch-2.14": {"x": 2}})
    out = _check_stack(store, "torch-2.15", {"x": 3})
    assert not out.passed and out.status is bl.Status.CHANGED_SINCE
    assert "changed since torch-2.14" in out.message and "x" in out.message and "pytest x --amp-regen" in out.message
    assert out.stored == {"x": 2}
    assert not store.path_for("s", "torch-2.15", "n").exists()
    assert store.obtained_path(store.path_for("s", "torch-2.15", "n")).exists()


def test_regen_writes_the_new_release_s_own_baseline(tmp_path):
    store = _stack_store(tmp_path, {"torch-2.14": {"x": 2}})
    _check_stack(store, "torch-2.15", {"x": 3}, bl.Mode.REGEN)
    assert json.loads(store.path_for("s", "torch-2.15", "n").read_text())["data"] == {"x": 3}
    assert _check_stack(store, "torch-2.15", {"x": 3}).status is bl.Status.MATCHED


def test_an_older_release_than_any_baseline_is_judged_against_the_nearest_later_one(tmp_path):
    """Earlier releases first, then later ones, each nearest first: torch 2.4 with baselines from
    2.11 on is judged against 2.11's, saying so; another profile's key is never a reference, and
    with no other release at all the baseline is missing."""
    store = _stack_store(
        tmp_path, {"torch-2.16": {"x": 1}, "torch-2.12": {"x": 2}, "nvidia-h200__torch-2.14": {"x": 1}}
    )
    out = _check_stack(store, "torch-2.4", {"x": 2})
    assert out.passed and out.status is bl.Status.INHERITED
    assert "nearest later release's" in out.message and "torch-2.12/n.json" in out.message
    assert store.other_releases("s", "n", "torch-2.15") == [
        (store.path_for("s", "torch-2.12", "n"), False),
        (store.path_for("s", "torch-2.16", "n"), True),
    ]
    assert store.earlier_releases("s", "n", "nvidia-h200__torch-2.15") == [
        store.path_for("s", "nvidia-h200__torch-2.14", "n")
    ]
    assert store.earlier_releases("s", "n", "any") == []
    alone = _stack_store(tmp_path / "alone", {"nvidia-h200__torch-2.14": {"x": 1}})
    assert _check_stack(alone, "torch-2.15", {"x": 1}).status is bl.Status.MISSING


@pytest.mark.parametrize(
    ("version", "stack"),
    [
        ("2.15.0+cu132", "torch-2.15"),
        ("2.16.0.dev20261201+cpu", "torch-2.16"),
        ("2.15.0rc3", "torch-2.15"),
        ("2.15.0a0+git1234abc", "torch-2.15"),
        ("2.13.0+cpu", "torch-2.13"),
    ],
)
def test_release_strings_of_every_kind_key_their_minor_release(version, stack):
    from harness.platform.versions import minor

    assert f"torch-{minor(version)}" == stack
