"""``amp-harness release REQUIREMENT``: qualify a torch release on the day it ships.

Builds an isolated environment holding the requirement (``torch==2.15.0``, a nightly, a local
wheel) and this checkout, runs the suites there and here, and answers the release question in one
report: which checks changed (with the stack diff), which known issues are fixed, still present or
new, which speedups moved beyond what the speed rule can tell apart, which baselines the new
release may adopt and which changed since the earlier release, and a verdict with an exit code.

The report is decided from the two run reports alone (:func:`release_report`): the environments
only produce them, so ``--candidate RUN`` and ``--reference RUN`` judge runs made elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.apps import diff as df
from harness.domains.versions import Lifecycle
from harness.numerics.verdict import Outcome, RowKind
from harness.storage import baselines as bl
from harness.storage import report as rp

#: The baseline row statuses the report lists: baselines the release may adopt as its own, and
#: baselines that changed since the earlier release.
ADOPTABLE = bl.Status.INHERITED.value
CHANGED_SINCE = bl.Status.CHANGED_SINCE.value


#: the report's heading for each lifecycle state the registry agrees with
_CATEGORIES = {
    Lifecycle.PRESENT: "present, as registered",
    Lifecycle.STILL_PRESENT: "still present",
    Lifecycle.FIXED_HERE: "fixed?",
    Lifecycle.ABSENT: "absent, as registered",
}


@dataclass(frozen=True)
class KnownIssueState:
    """One known issue as the candidate release observed it."""

    id: str
    suite: str
    outcome: Outcome
    #: the lifecycle's words: "still present in ...", "did not occur ...: fixed in 2.15?", ...
    lifecycle: str
    #: where the observation left the lifecycle, as the registry check decided it
    state: Lifecycle

    @property
    def category(self) -> str:
        if not self.state.holds:
            return "regressed or outside its registered range"
        return _CATEGORIES[self.state]


@dataclass
class ReleaseReport:
    """What the candidate release changed against the reference run, decided once."""

    diff: df.Diff
    known: list[KnownIssueState] = field(default_factory=list)
    #: (baseline file, node id) of baselines the release matched from an earlier release
    adopt: list[tuple[str, str]] = field(default_factory=list)
    #: (baseline file, node id, first line of the difference) of baselines changed since then
    changed_baselines: list[tuple[str, str, str]] = field(default_factory=list)
    #: (node id, first line of its failure) of the candidate's failed tests
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def verdict(self) -> Outcome:
        """FAIL when the candidate failed a check or the diff found a regression; PASS otherwise
        (behaviour changes and known issues are listed, not failures)."""
        return Outcome.FAIL if self.failures or self.diff.regressed else Outcome.PASS

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict is Outcome.PASS else 1


def release_report(reference: df.Side, candidate: df.Side) -> ReleaseReport:
    """The release report of ``candidate`` (the new release's run) against ``reference``."""
    report = ReleaseReport(df.diff(reference, candidate))
    for r in rp.records(candidate.report.rows):
        tags = rp.row_tags(r)
        metric = str(r["metric"])
        if str(r.get("kind")) == RowKind.KNOWN_ISSUE.value or metric.startswith("known_issue."):
            outcome = Outcome.parse(str(r["outcome"]))
            issue = metric.removeprefix("known_issue.")
            lifecycle = str(tags.get("lifecycle", ""))
            report.known.append(KnownIssueState(issue, str(r["suite"]), outcome, lifecycle, _state(tags, outcome)))
        status = tags.get("status")
        if metric.startswith("baseline.") and status == ADOPTABLE:
            report.adopt.append((str(tags.get("baseline", "")), str(r["nodeid"])))
        elif metric.startswith("baseline.") and status == CHANGED_SINCE:
            report.changed_baselines.append((str(tags.get("baseline", "")), str(r["nodeid"]), str(r["note"])))
    for t in rp.records(candidate.report.tests):
        if Outcome.parse(str(t["verdict"])).fails_test:
            first_line = (str(t.get("message") or "").splitlines() or [""])[0]
            report.failures.append((str(t["nodeid"]), first_line[:200]))
    return report


def _state(tags: dict[str, Any], outcome: Outcome) -> Lifecycle:
    """The row's lifecycle state; a report written before rows carried one: what its outcome says."""
    if "lifecycle_state" in tags:
        return Lifecycle(str(tags["lifecycle_state"]))
    return {Outcome.KNOWN: Lifecycle.PRESENT, Outcome.PASS: Lifecycle.ABSENT}.get(outcome, Lifecycle.OUTSIDE)


def render(report: ReleaseReport) -> str:
    """The release report as text: the verdict first, then each section."""
    d = report.diff
    lines = [
        f"release report: {report.verdict.label} (exit {report.exit_code})",
        *(f"  {line}" for side in (d.a, d.b) for line in side.describe().splitlines()),
        f"  diff: {d.summary()}",
        "",
        f"failed checks on the candidate: {len(report.failures) or 'none'}",
        *(f"  {node}: {message}" for node, message in report.failures),
        "",
        "checks, policy cells, op sequences and metrics that changed:",
    ]
    changed = [
        c for c in d.changes if c.status is not df.Status.UNCHANGED and c.kind in ("check", "policy", "ops", "metric")
    ]
    lines += [
        f"  {c.status.value:<9} {c.suite}/{c.kind} {c.name}: {c.a} -> {c.b}" + (f" ({c.detail})" if c.detail else "")
        for c in changed
    ] or ["  none"]
    lines += ["", "known issues:"]
    for category in ("regressed or outside its registered range", "fixed?", "still present", "present, as registered"):
        issues = [k for k in report.known if k.category == category]
        if issues:
            lines.append(f"  {category}:")
            lines += [f"    {k.id} ({k.suite}): {k.lifecycle}" for k in issues]
    if not report.known:
        lines.append("  none observed")
    moved = [c for c in d.changes if c.kind == "speed" and c.status is not df.Status.UNCHANGED]
    lines += ["", "speedups that moved beyond the speed rule's detectable change:"]
    lines += [f"  {c.suite} {c.name}: {c.a} -> {c.b} {c.detail}" for c in moved] or ["  none"]
    lines += ["", "baselines changed since the earlier release (review; the failure shows the difference):"]
    lines += [f"  {path} ({node}): {note}" for path, node, note in report.changed_baselines] or ["  none"]
    lines += ["", "baselines the release may adopt (judged equal to the earlier release's):"]
    lines += [f"  {path}: pytest '{node}' --amp-regen" for path, node in report.adopt] or ["  none"]
    return "\n".join(lines) + "\n"


# -- producing the two runs -------------------------------------------------------------------------
class ReleaseError(Exception):
    """The environment or a run could not be made: the message says which step and why."""


def build_environment(env_dir: Path, requirements: list[str], project: Path) -> Path:
    """A virtual environment at ``env_dir`` holding ``requirements`` and ``project`` (this checkout,
    editable, with its fp8 extra); its python. An existing one is reused and brought up to date.
    pip's own configuration applies (a cap on torch in a pip.conf: lift it with PIP_CONFIG_FILE)."""
    python = env_dir / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(env_dir)
    cmd = [str(python), "-m", "pip", "install", "-q", *requirements, "-e", f"{project}[fp8]"]
    # the reference's pins (PIP_CONSTRAINT: constraints/cpu.txt under tox) must not hold the candidate
    env = {k: v for k, v in os.environ.items() if k != "PIP_CONSTRAINT"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"pip install {' '.join(requirements)} in {env_dir} failed:\n{done.stderr[-3000:]}")
    return python


def run_suites(python: Path, project: Path, report_dir: Path, pytest_args: list[str]) -> Path:
    """``pytest suites/`` with ``python``, its run report under ``report_dir``; the run's path."""
    cmd = [str(python), "-m", "pytest", "suites/", "-p", "no:cacheprovider", "-q", f"--amp-report-dir={report_dir}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([*cmd, *pytest_args], cwd=project, env=env, check=False)
    try:
        return rp.newest_run(report_dir)
    except rp.ReportError as e:
        raise ReleaseError(f"the suites wrote no run report with {python}: {e}") from None


def here() -> Path:
    return Path(sys.executable)
