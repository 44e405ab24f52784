"""The qualification verdict: `amp-harness qualify` runs the suites (or a user's tests), reads
typed test properties from its JUnit XML and decides per capability; usage errors exit 4 quoting
the cause. Nothing here times anything: these tests share the machine with the other workers'
(the speed checks' own calibrated verdicts are tests/test_speed_and_qualify.py's)."""

from __future__ import annotations

import fnmatch
import json

import pytest
from helpers import REPO

from harness.apps import qualify
from harness.apps.cli import main


def _case(name: str, cap: str, inner: str = "", props: tuple[tuple[str, str], ...] = ()) -> str:
    p = "".join(f'<property name="{k}" value="{v}"/>' for k, v in (("amp_capability", cap), *props))
    return f'<testcase classname="x" name="{name}"><properties>{p}</properties>{inner}</testcase>'


JUNIT = (
    '<?xml version="1.0"?><testsuites><testsuite>'
    + _case("test_x", "formats")
    + _case(
        "test_y", "speed", '<skipped message="NOISY: matmul"/>', (("amp_outcome", "noisy"), ("amp_note", "straddles"))
    )
    + _case("test_z", "memory", '<failure message="no activation saving"/>')
    + _case(
        "test_w", "numerics", "", (("amp_outcome", "unjudged"), ("amp_note", "calibrate it: amp-harness calibrate"))
    )
    + "</testsuite></testsuites>"
)


def test_verdicts_and_exit_status(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(JUNIT)
    vs = {v.capability: v for v in qualify.verdicts(junit)}
    assert vs["formats"].status is qualify.Outcome.PASS
    assert vs["speed"].status is qualify.Outcome.NOISY and "straddles" in vs["speed"].reason
    assert vs["memory"].status is qualify.Outcome.FAIL and "no activation saving" in vs["memory"].reason
    assert vs["numerics"].status is qualify.Outcome.UNJUDGED and "amp-harness calibrate" in vs["numerics"].reason
    assert vs["loss scaling"].status is qualify.Outcome.SKIP
    assert qualify.exit_status(list(vs.values()), ["formats", "memory"]) == 1
    assert qualify.exit_status(list(vs.values()), ["formats", "speed"]) == 2
    assert qualify.exit_status(list(vs.values()), ["formats", "numerics"]) == 2
    assert qualify.exit_status(list(vs.values()), ["formats"]) == 0


def test_qualify_runs_the_suites_and_prints_the_verdict(tmp_path, capfd):
    common = [
        "--",
        str(REPO / "suites/formats/test_format_limits.py"),
        "-q",
        "-p",
        "no:cacheprovider",
        f"--rootdir={REPO}",
        "-n",
        "0",  # the project's addopts start two xdist workers: three interpreters importing torch for six checks
    ]
    code = main(["qualify", "--report-dir", str(tmp_path), *common])
    out = capfd.readouterr().out
    assert "qualification verdict" in out and "formats" in out
    assert code == 2  # the other capabilities did not run
    assert "NOT QUALIFIED: a required capability is inconclusive, noisy, not judged, or did not run" in out
    assert (tmp_path / "junit-qualify.xml").exists()
    [run] = [p for p in tmp_path.iterdir() if p.is_dir()]
    verdict = json.loads((run / "verdict.json").read_text())
    assert {v["capability"]: v["status"] for v in verdict["verdicts"]}["formats"] == "PASS"
    # the same verdicts under other requirements (one pytest run is enough: the rule is pure)
    vs = qualify.verdicts(tmp_path / "junit-qualify.xml")
    others = [c for c in qualify.CAPABILITIES if c != "formats"]
    assert qualify.exit_status(vs, qualify.required_capabilities(vs, True, others)) == 0
    assert qualify.exit_status(vs, qualify.required_capabilities(vs, False, ())) == 0  # a user's tests
    assert qualify.required_capabilities(vs, False, ()) == ["formats"]
    assert main(["qualify", "--optional", "sped", *common]) == 4
    assert "--optional sped: not a capability" in capfd.readouterr().err


USER_TEST = """
import torch
from torch import nn
from harness.api import BF16, Setup


def model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def batch(step, generator):
    x = torch.randn(32, 16, generator=generator)
    return x, x[:, :4] * 2


def test_my_recipe_matches_fp32(amp_training):
    setup = Setup("mine", model, batch, nn.functional.mse_loss, steps=6, lr=1e-2, checkpoint_every=3)
    amp_training.check(setup, [BF16], seeds=2, lane=False, power=False, census=False)
"""


@pytest.mark.parametrize(
    ("argv", "quoted"),
    [
        ([], "*file or directory not found: suites/*no tests named and no suites/ directory*"),
        (["missing_dir/"], "*file or directory not found: missing_dir/*"),
        (["empty/", "--", "--amp-tier=vigorous"], "*--amp-tier*invalid choice*"),
        (["--oprional", "speed"], "*unrecognized arguments: --oprional*pytest options go after --*"),
        (["empty/"], "*collected no tests (exit 5)*"),
    ],
)
def test_qualify_usage_errors_exit_4_quoting_the_cause(pytester, capfd, argv, quoted):
    (pytester.path / "empty").mkdir()
    code = main(["qualify", "--report-dir", str(pytester.path / "r"), *argv])
    err = capfd.readouterr().err
    assert code == qualify.USAGE_ERROR, err
    assert fnmatch.fnmatch(err.replace("\n", " "), f"*{quoted}*"), err


def test_qualify_judges_a_users_project_by_the_fixtures_its_tests_use(pytester, capfd):
    """A user's project: no suites/, no markers; amp_training tests decide training parity."""
    pytester.makepyfile(test_mine=USER_TEST)
    code = main(["qualify", "--report-dir", str(pytester.path / "r"), "test_mine.py", "--", "-p", "no:cacheprovider"])
    out = capfd.readouterr().out
    lines = {line.split("  ")[0]: line for line in out.splitlines() if line.startswith(tuple(qualify.CAPABILITIES))}
    assert "PASS" in lines["training parity"] and "1 passed" in lines["training parity"], out
    assert "(not required)" in lines["speed"]
    assert code == 0 and "QUALIFIED" in out


def test_an_undeclared_capability_is_a_usage_error(pytester):
    pytester.makepyfile(
        test_cap="import pytest\npytestmark = pytest.mark.amp_capability('vibes')\n\ndef test_a():\n    pass\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--amp-no-report")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*amp_capability('vibes') is not a capability*"])


def test_the_example_ci_workflow_runs_qualify():
    text = (REPO / "examples" / "ci" / "qualify-gpu.yml").read_text()
    assert "amp-harness qualify" in text and "self-hosted" in text
