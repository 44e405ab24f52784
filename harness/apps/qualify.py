"""``amp-harness qualify``: run the suites, then one verdict per capability for CI.

Which capability a test decides is declared by its suite (``pytest.mark.amp_capability``) and
travels as a JUnit XML test property, as do the typed row outcomes that label a test NOISY or
UNJUDGED; nothing here matches paths or searches message text. Each capability gets the worst
:class:`~harness.numerics.verdict.Outcome` of its tests, with its reason.

Which capabilities are required: all of them when qualifying the ``suites/`` of the working
directory (no paths, or paths inside it); for a user's own tests, those the tests decide. A
user's test decides a capability through the amp-harness fixture it uses (``amp_training``
decides training parity), or its marker.

Exit status: 0 when every required capability passed (PASS, or KNOWN: a registered deviation
confirmed present); 1 when a required one failed; 2 when none failed but a required one is
INCONCLUSIVE, NOISY, NOT JUDGED (for example the speed of a hardware class that
was never calibrated: the reason names the command that calibrates it) or did not run; 4 on a
usage error (no ``suites/`` and no tests named, pytest's own usage error or nothing collected,
quoted from pytest).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.domains.capabilities import CAPABILITIES as CAPABILITIES
from harness.numerics.verdict import Outcome
from harness.pytest_plugin.recording import CAPABILITY_PROPERTY, NOTE_PROPERTY, OUTCOME_PROPERTY
from harness.storage import atomic
from harness.storage import journal as jr
from harness.storage import report as rp

#: A capability's verdict is an :class:`Outcome` (one vocabulary with rows, the dashboard and
#: diff), printed by its label: PASS, FAIL, NOISY, NOT JUDGED, INCONCLUSIVE, KNOWN or SKIPPED.
Status = Outcome


@dataclass(frozen=True)
class Verdict:
    capability: str
    status: Status
    reason: str
    tests: int


@dataclass(frozen=True)
class Case:
    """One JUnit testcase (or one test result of a run report): its outcome and message, and the
    harness's properties."""

    name: str
    outcome: str  # passed | failure | error | skipped | hung | crashed
    message: str
    capability: str | None
    labels: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    #: JUnit's classname (the test's module and class, dotted): with ``name``, which test it is
    classname: str = ""


def junit_names(nodeid: str) -> tuple[str, str]:
    """(classname, name) JUnit XML gives a node id (pytest's ``mangle_test_address``)."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]


def report_cases(report: rp.LoadedReport) -> list[Case]:
    """The report's test results as cases: what a run whose pytest died (no JUnit XML) is judged
    on, and the CRASHED and HUNG results a JUnit file only knows as failures."""
    notes: dict[str, dict[str, str]] = {}
    for r in rp.records(report.rows[["nodeid", "outcome", "note"]]):
        outcome = Outcome.parse(str(r["outcome"]))
        if outcome.severity > Outcome.PASS.severity:
            notes.setdefault(str(r["nodeid"]), {}).setdefault(outcome.value, str(r["note"] or ""))
    out = []
    for t in rp.records(report.tests):
        nodeid = str(t["nodeid"])
        classname, name = junit_names(nodeid)
        result = str(t["result"])
        junit_outcome = {"failed": "failure"}.get(result, result)
        capability = t.get("capability")
        labelled = notes.get(nodeid, {})
        out.append(
            Case(
                name,
                junit_outcome,
                str(t.get("message") or ""),
                str(capability) if isinstance(capability, str) and capability else None,
                tuple(labelled),
                tuple(labelled.values()),
                classname,
            )
        )
    return out


def with_broken(found: Sequence[Case], report: rp.LoadedReport) -> list[Case]:
    """JUnit's cases with the report's CRASHED and HUNG results in place of what JUnit says of
    those tests (a worker crash reaches JUnit as a failure without the test's capability)."""
    broken = {(c.classname, c.name): c for c in report_cases(report) if Outcome.of_test(c.outcome).broke}
    out = [broken.pop((c.classname, c.name), c) for c in found]
    return out + list(broken.values())


def cases(junit: Path) -> list[Case]:
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, message = tag, (el.get("message") or "").strip()
                break
        props = [(p.get("name", ""), p.get("value", "")) for p in case.iter("property")]
        capability = next((v for k, v in props if k == CAPABILITY_PROPERTY), None)
        labels = tuple(v for k, v in props if k == OUTCOME_PROPERTY)
        notes = tuple(v for k, v in props if k == NOTE_PROPERTY)
        out.append(Case(case.get("name", ""), outcome, message, capability, labels, notes, case.get("classname", "")))
    return out


def _verdict(name: str, mine: Sequence[Case]) -> Verdict:
    """The worst of the capability's tests (:meth:`Outcome.of_test`: a failed test labelled
    inconclusive tested nothing, a skipped one labelled noisy was too noisy to judge), with the
    reason of the first test that has it."""
    if not mine:
        return Verdict(name, Outcome.SKIP, "no tests of this capability ran", 0)
    outcomes = [Outcome.of_test(c.outcome, c.labels) for c in mine]
    worst = Outcome.worst(outcomes)
    assert worst is not None
    these = [c for c, o in zip(mine, outcomes, strict=True) if o is worst]
    first = these[0]
    why = first.notes[0] if first.notes else first.message
    reasons = {
        Outcome.CRASHED: f"{len(these)} crashed; first: {first.name}: {first.message[:200]}",
        Outcome.HUNG: f"{len(these)} hung; first: {first.name}: {first.message[:200]}",
        Outcome.FAIL: f"{len(these)} failed; first: {first.name}: {first.message[:160]}",
        Outcome.INCONCLUSIVE: f"{len(these)} check(s) tested nothing: {why[:300]}",
        Outcome.NOISY: f"{len(these)} measurement(s) too noisy to judge, after a rerun: {why[:200]}",
        Outcome.UNJUDGED: f"{len(these)} of {len(mine)} measured, not judged: {why[:300] or 'no reason recorded'}",
        Outcome.SKIP: f"all {len(mine)} skipped: {first.message[:160]}",
    }
    ran = sum(o in (Outcome.PASS, Outcome.KNOWN) for o in outcomes)
    skipped = f", {len(mine) - ran} skipped" if len(mine) > ran else ""
    known = sum(o is Outcome.KNOWN for o in outcomes)
    default = f"{ran} passed{skipped}" + (f" ({known} a known deviation, expected to fail)" if known else "")
    return Verdict(name, worst, reasons.get(worst, default), len(mine))


def verdicts(junit: Path | None, report: rp.LoadedReport | None = None, earlier: Sequence[Case] = ()) -> list[Verdict]:
    """One verdict per capability, from the JUnit XML and the run report: a run whose pytest died
    has no JUnit XML and is judged on its report (recovered from its journal). ``earlier``: the
    finished tests of earlier parts of a resumed qualification, judged with this part's."""
    if junit is not None and junit.exists():
        found = cases(junit)
        if report is not None:
            found = with_broken(found, report)
    elif report is not None:
        found = report_cases(report)
    else:
        found = []
    now = {(c.classname, c.name) for c in found}
    found = [c for c in earlier if (c.classname, c.name) not in now] + list(found)
    declared = [c for c in dict.fromkeys(c.capability for c in found) if c and c not in CAPABILITIES]
    return [_verdict(name, [c for c in found if c.capability == name]) for name in (*CAPABILITIES, *declared)]


def self_test_line(report: rp.LoadedReport) -> str | None:
    """The project's tests of itself (``amp_self_tests``), in one line: they decide no capability
    and never change the verdict. None where the run had none."""
    own = rp.of_origin(report.tests, rp.SELF_TEST)
    if own.empty:
        return None
    counts = own["result"].astype(str).value_counts()
    tally = ", ".join(f"{n} {result}" for result, n in counts.items())
    return f"project self-tests (not part of the verdict): {len(own)} tests, {tally}"


def exit_status(vs: Sequence[Verdict], required: Sequence[str]) -> int:
    req = [v for v in vs if v.capability in required]
    if any(v.status.fails_test and v.status is not Outcome.INCONCLUSIVE for v in req):
        return 1
    if any(v.status not in (Outcome.PASS, Outcome.KNOWN) for v in req):
        return 2
    return 0


def table(vs: Sequence[Verdict], required: Sequence[str] | None = None) -> str:
    """One line per capability; those not required are marked so."""
    width = max(len(v.capability) for v in vs)
    status_width = max(len(v.status.label) for v in vs)
    lines = []
    for v in vs:
        mark = "" if required is None or v.capability in required else "  (not required)"
        lines.append(f"{v.capability:<{width}}  {v.status.label:<{status_width}}  {v.reason}{mark}")
    return "\n".join(lines)


#: qualify's exit status for a usage error (pytest's own code for one)
USAGE_ERROR = 4
#: pytest.ExitCode.USAGE_ERROR and NO_TESTS_COLLECTED (not imported: the CLI stays light)
_PYTEST_USAGE_ERROR, _PYTEST_NO_TESTS = 4, 5
DEFAULT_TESTS = "suites/"


def _pytest(cmd: Sequence[str]) -> tuple[int, list[str]]:
    """Run pytest, streaming its output through; return its exit code and its last lines."""
    tail: deque[str] = deque(maxlen=60)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            tail.append(line.rstrip("\n"))
    sys.stdout.flush()
    return proc.returncode, list(tail)


def _quoted(tail: Sequence[str]) -> str:
    errors = [line for line in tail if line.startswith("ERROR") or ": error:" in line]
    errors = [line for line in errors if not line.startswith("ERROR: usage:")] or errors
    shown = errors or [line for line in tail if line.strip()][-3:]
    return "\n".join(f"  | {line}" for line in shown)


def _looks_like_a_path(arg: str) -> bool:
    """A test path among pytest's arguments; an option's separate value (``-p no:cacheprovider``,
    ``-k parity``) is not one unless it names something that exists."""
    if arg.startswith("-"):
        return False
    return "/" in arg or arg.endswith(".py") or "::" in arg or Path(arg).exists()


def _inside_suites(path: str) -> bool:
    """A test path inside this directory's ``suites/`` (a node id's ``::`` part aside)."""
    here = Path(DEFAULT_TESTS).resolve()
    target = Path(path.split("::")[0]).resolve()
    return target == here or here in target.parents


def required_capabilities(vs: Sequence[Verdict], own_suites: bool, optional: Sequence[str]) -> list[str]:
    """All capabilities for this project's suites; for a user's tests, those the tests decide."""
    decided = CAPABILITIES if own_suites else tuple(v.capability for v in vs if v.tests)
    return [c for c in decided if c not in optional]


def _recover(report_dir: Path, code: int | None) -> list[str]:
    """pytest ended without its report (a signal, ``code`` negative): the journals it left become
    run reports, the exit status naming the signal where the process left no fault record. None:
    an earlier part's journal, found before a resumed run (its exit status unknown)."""
    how = (
        f"recovered from its journal by amp-harness qualify, after pytest ended with exit status {code}"
        if code is not None
        else "recovered from its journal by amp-harness qualify --resume, before the next part"
    )
    made, problems = jr.recover_stale(report_dir, how=how, exit_status=code, returncode=code)
    for _, exc in problems:
        print(f"amp-harness qualify: {exc}", file=sys.stderr)
    return [str(path) for path in made]


def earlier_parts(report_dir: Path, runs: Sequence[Path]) -> list[Case]:
    """``--resume``: the finished tests of a qualification's earlier parts (``runs``), each from the
    part that finished it, as cases (:func:`harness.storage.journal.finished_tests`)."""
    done = jr.finished_tests(report_dir)
    out: dict[tuple[str, str], Case] = {}
    for run in runs:
        try:
            report = rp.load(run)
        except rp.ReportError:
            continue
        run_id = str(report.meta.get("run_id") or run.name)
        mine = {junit_names(n) for n, r in done.items() if r == run_id}
        for c in report_cases(report):
            if (c.classname, c.name) in mine:
                out[(c.classname, c.name)] = c
    return list(out.values())


def run(
    pytest_args: Sequence[str],
    report_dir: Path,
    required: Sequence[str] | None = None,
    optional: Sequence[str] = (),
    resume: bool = False,
) -> int:
    """Run pytest and print the verdict table; ``required`` None: see :func:`required_capabilities`.
    ``resume``: ``report_dir`` holds earlier parts of this qualification, cut short: their finished
    tests are not run again (``--amp-resume``) and the verdict judges every part together."""
    args = list(pytest_args)
    paths = [a for a in args if _looks_like_a_path(a)]
    own_suites = all(_inside_suites(a) for a in paths)
    if not paths and not Path(DEFAULT_TESTS).is_dir():  # said at once, not after starting pytest
        print(
            f"amp-harness qualify: usage error: file or directory not found: {DEFAULT_TESTS}\nno tests named and no "
            f"{DEFAULT_TESTS} directory in {Path.cwd()}: name the tests to qualify, e.g. `amp-harness qualify tests/` "
            "(pytest options after --)",
            file=sys.stderr,
        )
        return USAGE_ERROR
    if not paths:
        args.insert(0, DEFAULT_TESTS)
    report_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        recovered_before = _recover(report_dir, None)
        if recovered_before:
            print(f"amp-harness qualify: an earlier part's journal, recovered: {', '.join(recovered_before)}")
        args.append(f"--amp-resume={report_dir}")
    before = set(rp.find_runs(report_dir)) if report_dir.exists() else set()
    junit = report_dir / "junit-qualify.xml"
    junit.unlink(missing_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *args,
        f"--junitxml={junit}",
        f"--amp-report-dir={report_dir}",
        "-o",
        "junit_family=xunit2",
    ]
    print("amp-harness qualify:", " ".join(cmd), flush=True)
    code, tail = _pytest(cmd)
    if code in (_PYTEST_USAGE_ERROR, _PYTEST_NO_TESTS):
        what = "refused the arguments" if code == _PYTEST_USAGE_ERROR else "collected no tests"
        print(f"amp-harness qualify: usage error: pytest {what} (exit {code}):\n{_quoted(tail)}", file=sys.stderr)
        return USAGE_ERROR
    recovered = _recover(report_dir, code) if code < 0 or not junit.exists() else []
    new_runs = sorted(set(rp.find_runs(report_dir)) - before)
    report = rp.load(new_runs[-1]) if new_runs else None
    if not junit.exists() and report is None:
        print(f"amp-harness qualify: pytest wrote no JUnit XML and no run report (exit {code}); nothing to judge",
              file=sys.stderr)  # fmt: skip
        return 1
    if recovered:
        print(f"amp-harness qualify: pytest died (exit {code}); the run's journal, recovered: {', '.join(recovered)}")
    earlier = earlier_parts(report_dir, sorted(before)) if resume else []
    vs = verdicts(junit, report, earlier)
    req = list(required) if required is not None else required_capabilities(vs, own_suites, optional)
    if not req:
        print(
            "amp-harness qualify: usage error: none of these tests decides a capability. A test decides one through "
            "the amp-harness fixture it uses (amp_training: training parity, amp_speedup: speed) or an "
            "amp_capability marker.",
            file=sys.stderr,
        )
        return USAGE_ERROR
    print("\n" + "=" * 24 + " qualification verdict " + "=" * 24)
    print(table(vs, req))
    own = self_test_line(report) if report is not None else None
    if own is not None:
        print(own)
    status = exit_status(vs, req)
    summary = {
        "verdicts": [{**asdict(v), "status": v.status.label} for v in vs],
        "required": req,
        "exit_status": status,
        "junit": str(junit),
        "pytest_exit": code,
    }
    if new_runs:
        atomic.write_text(new_runs[-1] / "verdict.json", json.dumps(summary, indent=2) + "\n")
        print(f"run report: {new_runs[-1]}  JUnit XML: {junit}")
    print(
        {
            0: "QUALIFIED",
            1: "NOT QUALIFIED: a required capability failed",
            2: "NOT QUALIFIED: a required capability is inconclusive, noisy, not judged, or did not run",
        }[status]
    )
    return status
