"""``amp-harness qualify``: run the suites, then one verdict per capability for CI.

Each capability gets PASS, FAIL, NOISY or SKIPPED with its reason, from the JUnit XML of the run
(test outcomes) and the run report (NOISY measurements). The exit status is 0 only when every
capability required for the profile passed: 1 when one failed, 2 when none failed but one was
noisy or a required one did not run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.storage import report as rp

#: (capability, path fragment of the tests that decide it)
CAPABILITIES: tuple[tuple[str, str], ...] = (
    ("formats", "suites/formats/"),
    ("autocast policy", "suites/autocast/test_op_policy"),
    ("numerics", "suites/autocast/test_op_numerics"),
    ("loss scaling", "suites/scaler/"),
    ("training parity", "suites/training/"),
    ("speed", "suites/speed/"),
    ("memory", "suites/memory/"),
    ("distributed", "suites/distributed/"),
)


@dataclass(frozen=True)
class Verdict:
    capability: str
    status: str  # PASS | FAIL | NOISY | SKIPPED
    reason: str
    tests: int


def _cases(junit: Path) -> list[tuple[str, str, str]]:
    """(path-like test id, outcome, message) for every testcase of a JUnit XML file."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + "::" + case.get("name", "")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, message = tag, (el.get("message") or "").strip()
                break
        out.append((path, outcome, message))
    return out


def verdicts(junit: Path) -> list[Verdict]:
    cases = _cases(junit)
    result = []
    for name, fragment in CAPABILITIES:
        mine = [c for c in cases if fragment.rstrip("/") in c[0]]
        failed = [c for c in mine if c[1] in ("failure", "error")]
        noisy = [c for c in mine if c[1] == "skipped" and "NOISY" in c[2]]
        ran = [c for c in mine if c[1] == "passed"]
        if not mine:
            result.append(Verdict(name, "SKIPPED", "no tests of this capability ran", 0))
        elif failed:
            result.append(
                Verdict(
                    name,
                    "FAIL",
                    f"{len(failed)} failed; first: {failed[0][0].split('::')[-1]}: {failed[0][2][:160]}",
                    len(mine),
                )
            )
        elif noisy:
            result.append(
                Verdict(
                    name,
                    "NOISY",
                    f"{len(noisy)} measurement(s) too noisy to judge, after a rerun: {noisy[0][2][:160]}",
                    len(mine),
                )
            )
        elif not ran:
            result.append(Verdict(name, "SKIPPED", f"all {len(mine)} skipped: {mine[0][2][:160]}", len(mine)))
        else:
            result.append(
                Verdict(
                    name,
                    "PASS",
                    f"{len(ran)} passed" + (f", {len(mine) - len(ran)} skipped" if len(mine) > len(ran) else ""),
                    len(mine),
                )
            )
    return result


def exit_status(vs: Sequence[Verdict], required: Sequence[str]) -> int:
    req = [v for v in vs if v.capability in required]
    if any(v.status == "FAIL" for v in req):
        return 1
    if any(v.status != "PASS" for v in req):
        return 2
    return 0


def table(vs: Sequence[Verdict]) -> str:
    width = max(len(v.capability) for v in vs)
    return "\n".join(f"{v.capability:<{width}}  {v.status:<7}  {v.reason}" for v in vs)


def run(pytest_args: Sequence[str], report_dir: Path, required: Sequence[str] | None = None) -> int:
    report_dir.mkdir(parents=True, exist_ok=True)
    before = set(rp.find_runs(report_dir)) if report_dir.exists() else set()
    junit = report_dir / "junit-qualify.xml"
    args = list(pytest_args) or ["suites/"]
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
    code = subprocess.run(cmd, check=False).returncode  # pytest's own progress display streams through
    if not junit.exists():
        print(f"amp-harness qualify: pytest wrote no JUnit XML (exit {code}); nothing to judge", file=sys.stderr)
        return 1
    vs = verdicts(junit)
    req = list(required) if required is not None else [c for c, _ in CAPABILITIES]
    print("\n" + "=" * 24 + " qualification verdict " + "=" * 24)
    print(table(vs))
    status = exit_status(vs, req)
    new_runs = sorted(set(rp.find_runs(report_dir)) - before)
    summary = {
        "verdicts": [asdict(v) for v in vs],
        "required": req,
        "exit_status": status,
        "junit": str(junit),
        "pytest_exit": code,
    }
    if new_runs:
        (new_runs[-1] / "verdict.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
        print(f"run report: {new_runs[-1]}  JUnit XML: {junit}")
    print(
        {
            0: "QUALIFIED",
            1: "NOT QUALIFIED: a required capability failed",
            2: "NOT QUALIFIED: a required capability is noisy or did not run",
        }[status]
    )
    return status
