"""Baseline storage and lifecycle (pytest-regressions semantics, syrupy's separation of parts).

* :class:`Serializer` turns a :class:`BaselineDocument` into versioned, sorted, indented JSON and
  back, rejecting anything it cannot trust (corrupt text, NaN, wrong format version, wrong key).
* :class:`BaselineStore` maps (suite, key, name) to paths under the baseline root, queues writes
  and flushes them atomically (temporary file + rename) at session end.
* :func:`check` is the lifecycle: missing -> fail and write; mismatch -> fail and leave an
  ``.obtained`` file; ``REGEN`` -> rewrite and still fail; ``ACCEPT`` -> rewrite and pass.

Baseline keys (which directory a baseline lives in) are chosen per kind of baseline:

``KeyKind.UNIVERSAL`` (``any``)
    facts that hold on every machine and release (format limits).
``KeyKind.STACK`` (``torch-2.13``)
    behaviour that belongs to the software release (fp8 cast saturation, autocast policy).
``KeyKind.PROFILE`` (``cpu-avx512bf16``)
    measurements that belong to the hardware class (speed, golden loss curves).
``KeyKind.PROFILE_STACK`` (``nvidia-h200__torch-2.13``)
    measurements that depend on both (numerics of vendor kernels).
"""

from __future__ import annotations

import errno
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from harness.numerics.comparison import DataComparison, compare_data, explain
from harness.numerics.tolerance import EXACT, Tolerance
from harness.platform.versions import release
from harness.storage import atomic

FORMAT_NAME = "amp-harness-baseline"
FORMAT_VERSION = 1
SUFFIX = ".json"
OBTAINED_SUFFIX = ".obtained.json"


class KeyKind(Enum):
    UNIVERSAL = "universal"
    STACK = "stack"
    PROFILE = "profile"
    PROFILE_STACK = "profile+stack"


def key_for(kind: KeyKind, profile: str, stack: str) -> str:
    if kind is KeyKind.UNIVERSAL:
        return "any"
    if kind is KeyKind.STACK:
        return stack
    if kind is KeyKind.PROFILE:
        return profile
    return f"{profile}__{stack}"


class Mode(Enum):
    CHECK = "check"
    #: rewrite missing/mismatching/unreadable baselines, and still fail (review the diff)
    REGEN = "regen"
    #: rewrite missing/mismatching/unreadable baselines, and pass
    ACCEPT = "accept"


class BaselineError(Exception):
    """A baseline file that cannot be trusted. Says which file, what is wrong and what to do."""

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        self.path, self.problem, self.fix = path, problem, fix
        super().__init__(f"Baseline {path}: {problem}. {fix}")


@dataclass(frozen=True)
class BaselineDocument:
    suite: str
    name: str
    key: str
    key_kind: str
    data: Any
    provenance: dict[str, Any]
    tolerance: dict[str, Any] | None = None
    format_version: int = FORMAT_VERSION


def _reject_constant(token: str) -> Any:
    raise ValueError(f"non-finite number {token}")


def _non_finite_paths(data: Any, path: str = "data") -> list[str]:
    if isinstance(data, float):
        return [] if math.isfinite(data) else [path]
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _non_finite_paths(v, f"{path}.{k}")]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in _non_finite_paths(v, f"{path}[{i}]")]
    return []


class Serializer:
    """Versioned JSON: sorted keys, 2-space indent, finite numbers only (diffable, reviewable)."""

    def dumps(self, doc: BaselineDocument) -> str:
        bad = _non_finite_paths(doc.data)
        if bad:
            raise ValueError(
                f"baseline {doc.suite}/{doc.name}: non-finite values at {', '.join(bad)} cannot be stored "
                "(NaN never compares equal); record them as strings such as 'nan' or 'inf'"
            )
        payload = {
            "format": FORMAT_NAME,
            "format_version": doc.format_version,
            "suite": doc.suite,
            "name": doc.name,
            "key": doc.key,
            "key_kind": doc.key_kind,
            "provenance": doc.provenance,
            "tolerance": doc.tolerance,
            "data": doc.data,
        }
        return json.dumps(payload, indent=2, sort_keys=True, allow_nan=False) + "\n"

    def loads(self, text: str, path: Path, regen_hint: str) -> BaselineDocument:
        try:
            raw = json.loads(text, parse_constant=_reject_constant)
        except ValueError as exc:
            if "non-finite" in str(exc):
                raise BaselineError(path, f"holds {exc}; NaN/inf values cannot be compared", regen_hint) from None
            raise BaselineError(path, f"is corrupt or truncated (not valid JSON: {exc})", regen_hint) from None
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise BaselineError(path, f'is not an amp-harness baseline (no "format": "{FORMAT_NAME}")', regen_hint)
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise BaselineError(
                path,
                f"has format_version {version!r}, this harness reads version {FORMAT_VERSION}",
                f"Regenerate it with this harness ({regen_hint.removeprefix('Regenerate: ')}) or use the harness version that wrote it",
            )
        missing = [k for k in ("suite", "name", "key", "key_kind", "provenance", "data") if k not in raw]
        if missing:
            raise BaselineError(path, f"is missing the fields {', '.join(missing)}", regen_hint)
        return BaselineDocument(
            suite=raw["suite"],
            name=raw["name"],
            key=raw["key"],
            key_kind=raw["key_kind"],
            data=raw["data"],
            provenance=raw["provenance"],
            tolerance=raw.get("tolerance"),
            format_version=version,
        )


class StoreWriteError(Exception):
    """A baseline that could not be written (permission, read-only file system, disk full...).
    Raised when the write is staged, so that the check which needed it fails saying so."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


def describe_os_error(exc: OSError) -> str:
    """``Permission denied (EACCES)``: the words and the errno name, without the file name."""
    name = errno.errorcode.get(exc.errno or 0, "")
    words = exc.strerror or str(exc)
    return f"{words} ({name})" if name else words


@dataclass
class BaselineStore:
    """Files under ``root/<suite>/<key>/<name>.json``; writes are queued until :meth:`flush`.

    A queued write is *staged* at once (a temporary sibling, written and fsynced) and renamed into
    place by :meth:`flush`: a store that cannot be written fails the check that wrote, with the
    path and the reason, and the session's end only renames. With ``candidates`` set, nothing is
    ever written under ``root`` (a read-only repository copy in CI): new, regenerated and obtained
    baselines go to the same relative path under ``candidates``.
    """

    root: Path
    serializer: Serializer = field(default_factory=Serializer)
    candidates: Path | None = None
    _staged: dict[Path, Path] = field(default_factory=dict)
    _removals: set[Path] = field(default_factory=set)
    used: set[Path] = field(default_factory=set)
    #: (path, reason) of every write or removal the session's end could not carry out
    errors: list[tuple[Path, str]] = field(default_factory=list)

    def path_for(self, suite: str, key: str, name: str) -> Path:
        for part, what in ((suite, "suite"), (key, "key"), (name, "name")):
            if not part or "/" in part or "\\" in part or part.startswith("."):
                raise ValueError(f"baseline {what} {part!r} must be a plain, non-hidden file name")
        return self.root / suite / key / f"{name}{SUFFIX}"

    @staticmethod
    def obtained_path(path: Path) -> Path:
        return path.with_name(path.name.removesuffix(SUFFIX) + OBTAINED_SUFFIX)

    def destination(self, path: Path) -> Path:
        """Where a write meant for ``path`` lands: ``path`` itself, or its twin under ``candidates``."""
        if self.candidates is None:
            return path
        return self.candidates / path.relative_to(self.root)

    def read(self, path: Path, regen_hint: str) -> BaselineDocument | None:
        """The stored document, ``None`` if there is none; BaselineError if it cannot be trusted."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineError(path, f"cannot be read ({exc})", regen_hint) from None
        return self.serializer.loads(text, path, regen_hint)

    def queue_write(self, path: Path, doc: BaselineDocument) -> Path:
        """Stage ``doc`` for ``path``; returns where it will land. StoreWriteError if it cannot."""
        target = self.destination(path)
        text = self.serializer.dumps(doc)
        try:
            staged = atomic.stage(target, text)
        except OSError as exc:
            raise StoreWriteError(target, describe_os_error(exc)) from None
        previous = self._staged.pop(target, None)
        if previous is not None:
            atomic.discard(previous)
        self._staged[target] = staged
        self._removals.discard(target)
        return target

    def queue_remove(self, path: Path) -> None:
        target = self.destination(path)
        if target not in self._staged:
            self._removals.add(target)

    @property
    def pending(self) -> list[Path]:
        return sorted(self._staged)

    def flush(self) -> list[Path]:
        """Rename every staged write into place and carry out the removals. Never raises: what
        fails is kept in :attr:`errors` (the session reports it) and the rest still happens."""
        written: list[Path] = []
        for path in sorted(self._staged):
            try:
                atomic.commit(self._staged[path], path)
                written.append(path)
            except OSError as exc:
                self.errors.append((path, describe_os_error(exc)))
        for path in sorted(self._removals):
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                self.errors.append((path, f"stale file not removed: {describe_os_error(exc)}"))
        self._staged.clear()
        self._removals.clear()
        return written

    def abandon(self) -> None:
        """Drop every staged write and removal (a rank of a launched world that is not rank 0:
        rank 0 alone writes the baselines)."""
        for staged in self._staged.values():
            atomic.discard(staged)
        self._staged.clear()
        self._removals.clear()

    def interrupted(self) -> list[Path]:
        """Files staged by a session that ended before renaming them into place (killed, or cut
        at a time limit): ``.<name>.json.<random>.tmp`` beside the baselines this session used,
        not staged by this session. Each is a complete candidate (staging fsyncs it whole)."""
        mine = set(self._staged.values())
        found: set[Path] = set()
        for d in {p.parent for p in self.used}:
            found |= {p for p in d.glob(f".*{SUFFIX}.*.tmp") if p not in mine}
        return sorted(found)

    def unused(self) -> list[Path]:
        """Baselines stored beside the ones this session used that no check of it used."""
        stored: set[Path] = set()
        for d in {p.parent for p in self.used}:
            stored |= {p for p in d.glob(f"*{SUFFIX}") if not p.name.endswith(OBTAINED_SUFFIX)}
        return sorted(stored - self.used)

    def earlier_releases(self, suite: str, name: str, key: str) -> list[Path]:
        """The same baseline stored for the releases before ``key``'s (a stack key ``torch-2.15``,
        or ``<profile>__torch-2.15``), the nearest first. Empty for a key that names no release."""
        return [p for p, later in self.other_releases(suite, name, key) if not later]

    def other_releases(self, suite: str, name: str, key: str) -> list[tuple[Path, bool]]:
        """The same baseline stored for other releases than ``key``'s, with whether each is later:
        the earlier ones nearest first, then the later ones nearest first. What a release with no
        baseline of its own is judged against (an old release, older than any baseline, by the
        oldest later one). Empty for a key that names no release."""
        prefix, release_of = _release_of(key)
        suite_dir = self.root / suite
        if release_of is None or not suite_dir.is_dir():
            return []
        earlier: list[tuple[tuple[int, int], Path]] = []
        later: list[tuple[tuple[int, int], Path]] = []
        for p in suite_dir.glob(f"*/{name}{SUFFIX}"):
            other_prefix, other = _release_of(p.parent.name)
            if other is None or other_prefix != prefix or other == release_of:
                continue
            (earlier if other < release_of else later).append((other, p))
        return [(p, False) for _, p in sorted(earlier, reverse=True)] + [(p, True) for _, p in sorted(later)]

    def references(self, suite: str, name: str, key: str) -> list[Path]:
        """The same baseline stored under other keys (other hardware profiles or stacks), sorted:
        the candidates a key with no baseline of its own may be compared against."""
        suite_dir = self.root / suite
        if not suite_dir.is_dir():
            return []
        return sorted(p for p in suite_dir.glob(f"*/{name}{SUFFIX}") if p.parent.name != key)

    def stored(self, suite: str, key: str) -> set[Path]:
        d = self.root / suite / key
        if not d.is_dir():
            return set()
        return {p for p in d.glob(f"*{SUFFIX}") if not p.name.endswith(OBTAINED_SUFFIX)}


def _release_of(key: str) -> tuple[str, tuple[int, int] | None]:
    """(the key without its stack, (major, minor)) of a key naming a release: ``torch-2.15`` ->
    ("", (2, 15)), ``nvidia-h200__torch-2.15`` -> ("nvidia-h200", (2, 15)); (key, None) otherwise."""
    prefix, _, stack = key.rpartition("__")
    if not stack.startswith("torch-"):
        return key, None
    try:  # the stack key is made by minor(): parsed by the same parser
        major, minor_, _patch = release(stack.removeprefix("torch-"))
    except ValueError:  # torch-unknown
        return key, None
    return prefix, (major, minor_)


class Status(Enum):
    """What the lifecycle did with one baseline (syrupy's created / updated / matched / failed)."""

    MATCHED = "matched"
    #: no baseline of this release's own; the nearest earlier release's matched
    INHERITED = "matched another release"
    #: no baseline of this release's own; the nearest earlier release's differs
    CHANGED_SINCE = "changed since another release"
    CREATED = "created"
    MISSING = "missing"
    MISMATCHED = "mismatched"
    REWRITTEN = "rewritten"
    UNREADABLE = "unreadable"
    WRONG_KEY = "wrong key"
    #: the baseline (or its obtained file) had to be written and could not be
    UNWRITABLE = "unwritable"


@dataclass(frozen=True)
class BaselineResult:
    """The typed result of one baseline check: whether the test passes, what happened, the
    message a failure shows (naming the file and the regenerate command), and the comparison."""

    passed: bool
    status: Status
    message: str
    path: Path
    comparison: DataComparison | None = None
    #: the stored data a mismatch was judged against
    stored: Any = None

    @property
    def summary(self) -> str:
        """One line for the report row's note."""
        return self.message.splitlines()[0] if self.message else self.status.value


def _describe_provenance(p: dict[str, Any]) -> str:
    bits = [str(p.get(k)) for k in ("created", "torch", "device", "profile") if p.get(k)]
    return ", ".join(bits) or "unknown provenance"


@dataclass(frozen=True)
class _Finding:
    """What the lifecycle found, before any write: the message in parts, so that a write that
    fails leaves out the sentence that would have claimed it."""

    passed: bool
    status: Status
    path: Path
    before: str = ""
    #: the sentence stating the write (shown only once the write is staged)
    claim: str = ""
    after: str = ""
    comparison: DataComparison | None = None
    #: (path to write, what it is) or None
    write: tuple[Path, str] | None = None
    stored: Any = None

    def result(self, written: bool) -> BaselineResult:
        text = "".join((self.before, self.claim if written else "", self.after))
        return BaselineResult(self.passed, self.status, text, self.path, self.comparison, self.stored)


def check(
    store: BaselineStore,
    *,
    suite: str,
    name: str,
    key: str,
    key_kind: KeyKind,
    data: Any,
    provenance: dict[str, Any],
    mode: Mode,
    regen_command: str,
    tolerance: Tolerance = EXACT,
    display: Callable[[Path], str] = str,
    comparator: Callable[[Any, Any], DataComparison] | None = None,
) -> BaselineResult:
    """Run one baseline through its lifecycle and say whether the test passes.

    ``display`` renders paths in messages (the pytest glue shows them relative to the cwd);
    ``comparator(stored, obtained)`` replaces the default leaf-by-leaf comparison. A write the
    store cannot make fails the check, naming the path and the reason (:attr:`Status.UNWRITABLE`).
    """
    path = store.path_for(suite, key, name)
    store.used.add(path)
    doc = BaselineDocument(suite, name, key, key_kind.value, data, provenance, tolerance.as_dict())
    found = _lifecycle(store, path, doc, mode, regen_command, tolerance, display, comparator)
    if found.write is None:
        return found.result(written=False)
    target, what = found.write
    try:
        store.queue_write(target, doc)
    except StoreWriteError as exc:
        unwritable = (
            f"Baseline store not writable: {what} {display(exc.path)} could not be written: {exc.reason}. "
            "Nothing was written there; the stored baselines are unchanged. Make the directory writable, or keep "
            "the repository's baselines read-only and send new and obtained baselines elsewhere with "
            "--amp-candidates-dir=DIR.\n"
        )
        kept = found.result(written=False)
        return BaselineResult(False, Status.UNWRITABLE, unwritable + kept.message, path, found.comparison)
    return found.result(written=True)


def _compare(
    name: str,
    stored: Any,
    obtained: Any,
    tolerance: Tolerance,
    comparator: Callable[[Any, Any], DataComparison] | None,
) -> DataComparison:
    """A baseline's stored data against this run's: the check's own comparator, else leaf by leaf."""
    return comparator(stored, obtained) if comparator is not None else compare_data(name, stored, obtained, tolerance)


def _against_earlier_release(
    store: BaselineStore,
    path: Path,
    doc: BaselineDocument,
    regen_command: str,
    tolerance: Tolerance,
    display: Callable[[Path], str],
    comparator: Callable[[Any, Any], DataComparison] | None,
) -> _Finding | None:
    """A release with no baseline of its own, judged against the nearest release's that has one,
    earlier first, then later (as a new hardware class is judged against a reference class): equal
    passes, naming that baseline; different fails with the difference and leaves this release's
    obtained file. None where no other release has a readable one (the baseline is then missing)."""
    hint = f"Regenerate: {regen_command}"
    for earlier, is_later in store.other_releases(doc.suite, doc.name, doc.key):
        try:
            reference = store.read(earlier, hint)
        except BaselineError:
            continue
        if reference is None:
            continue
        store.used.add(earlier)
        earlier_key = earlier.parent.name
        result = _compare(
            f"baseline {doc.suite}/{earlier_key}/{doc.name}", reference.data, doc.data, tolerance, comparator
        )
        obtained = store.obtained_path(path)
        judged = (
            f"Baseline {display(path)} does not exist: this release ({doc.key}) was judged against the nearest "
            f"{'later' if is_later else 'earlier'} release's, {display(earlier)} "
            f"({_describe_provenance(reference.provenance)})"
        )
        if result.passed:
            store.queue_remove(obtained)
            return _Finding(
                True,
                Status.INHERITED,
                path,
                f"{judged}: the same. Adopt it as this release's own with: {regen_command}",
                comparison=result,
            )
        return _Finding(
            False,
            Status.CHANGED_SINCE,
            path,
            f"{judged}: it changed since {earlier_key}.\n  this run: {_describe_provenance(doc.provenance)}\n"
            f"{explain(result)}\n",
            f"Obtained values: {display(store.destination(obtained))}\n",
            f"If the change is expected, write this release's baseline: {regen_command}",
            result,
            (obtained, "the obtained file"),
            reference.data,
        )
    return None


def _lifecycle(
    store: BaselineStore,
    path: Path,
    doc: BaselineDocument,
    mode: Mode,
    regen_command: str,
    tolerance: Tolerance,
    display: Callable[[Path], str],
    comparator: Callable[[Any, Any], DataComparison] | None,
) -> _Finding:
    suite, key, name = doc.suite, doc.key, doc.name
    shown = display(path)
    into = "" if store.candidates is None else f" into the candidates directory ({display(store.destination(path))})"
    hint = f"Regenerate: {regen_command}"
    try:
        stored = store.read(path, hint)
    except BaselineError as exc:
        if mode is Mode.CHECK:
            return _Finding(False, Status.UNREADABLE, path, f"{exc}\nThe file was left untouched.")
        return _Finding(
            mode is Mode.ACCEPT,
            Status.REWRITTEN,
            path,
            f"Unreadable baseline {shown} ({exc.problem}).",
            f" Rewritten from this run{into}.",
            write=(path, "the baseline"),
        )
    if stored is None and mode is Mode.CHECK:
        inherited = _against_earlier_release(store, path, doc, regen_command, tolerance, display, comparator)
        if inherited is not None:
            return inherited
    if stored is None:
        if mode is Mode.ACCEPT:
            return _Finding(
                True,
                Status.CREATED,
                path,
                f"Baseline {shown} missing.",
                f" Created{into}.",
                write=(path, "the baseline"),
            )
        return _Finding(
            False,
            Status.MISSING,
            path,
            f"Baseline missing: {shown}\n",
            f"It is written from this run ({_describe_provenance(doc.provenance)}){into} at the end of the session. "
            "Review and commit it; the test fails until then so that no baseline is created silently.",
            write=(path, "the baseline"),
        )
    if stored.suite != suite or stored.name != name or stored.key != key:
        problem = f"belongs to {stored.suite}/{stored.key}/{stored.name}, not {suite}/{key}/{name} (copied or moved?)"
        if mode is Mode.CHECK:
            return _Finding(
                False, Status.WRONG_KEY, path, f"{BaselineError(path, problem, hint)}\nThe file was left untouched."
            )
        return _Finding(
            mode is Mode.ACCEPT,
            Status.REWRITTEN,
            path,
            f"Baseline {shown}: it {problem}.",
            f" Rewritten{into}.",
            write=(path, "the baseline"),
        )
    result = _compare(f"baseline {suite}/{key}/{name}", stored.data, doc.data, tolerance, comparator)
    obtained = store.obtained_path(path)
    if result.passed:
        store.queue_remove(obtained)
        return _Finding(True, Status.MATCHED, path, comparison=result)
    if mode is not Mode.CHECK:
        store.queue_remove(obtained)
        verb = "accepted" if mode is Mode.ACCEPT else "regenerated; review the diff and commit it"
        return _Finding(
            mode is Mode.ACCEPT,
            Status.REWRITTEN,
            path,
            f"Baseline {shown}",
            f" {verb}{into}.",
            f"\n{explain(result)}",
            result,
            (path, "the baseline"),
        )
    return _Finding(
        False,
        Status.MISMATCHED,
        path,
        f"Baseline mismatch: {shown}\n  stored: {_describe_provenance(stored.provenance)}\n"
        f"  this run: {_describe_provenance(doc.provenance)}\n{explain(result)}\n",
        f"Obtained values: {display(store.destination(obtained))}\n",
        f"If the change is expected, regenerate the baseline: {regen_command}",
        result,
        (obtained, "the obtained file"),
        stored.data,
    )
