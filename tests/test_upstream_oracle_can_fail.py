"""Negative controls of the oracle built on PyTorch's own autocast lists: an op moved between the
lists, an op the catalogue does not reach, and a policy regression in torch each fail the named
check, with both sides shown."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from helpers import InnerRun, assert_caught, assert_clean, inject, run_inner

from harness.apps.cli import main
from harness.domains.autocast import oracle

SUITE = "autocast/test_upstream_lists.py"
#: the lists an Expectation is written back into, in the synthetic copy
LIST_OF = {
    oracle.Expectation.LOWER_PRECISION: "torch_16",
    oracle.Expectation.FP32: "torch_fp32",
    oracle.Expectation.PROMOTE: "torch_need_autocast_promote",
    oracle.Expectation.BUILTIN_PROMOTE: "torch_expect_builtin_promote",
    oracle.Expectation.BANNED: "banned",
}


def _lists_with(tmp: Path, changes: dict[str, oracle.Expectation]) -> Path:
    """A copy of the installed CPU lists (as the oracle reads them) with ``changes`` applied."""
    expectations = {**oracle.read_lists("cpu"), **changes}
    body = "\n".join(
        f"        self.{name} = [{', '.join(f'({op!r},)' for op, e in sorted(expectations.items()) if e is exp)}]"
        for exp, name in LIST_OF.items()
    )
    path = tmp / "autocast_test_lists.py"
    path.write_text(f"class AutocastCPUTestLists:\n    def __init__(self, dev):\n{body}\n", encoding="utf-8")
    return path


AGREES = "*::test_observed_policy_agrees_with_pytorchs_own_lists[[]cpu-bf16]"
REACHES = "*::test_the_catalogue_reaches_every_op_pytorch_lists[[]cpu]"


def _run(pytester, suite_copy, lists: Path | None, report: Path | None = None, **faults) -> InnerRun:
    suite_copy(SUITE, conftest=False)
    fixtures = {"autocast_lists_source": f"pathlib.Path({str(lists)!r})" if lists else "None"}
    inject(pytester, "autocast", fixtures=fixtures, **faults)
    return run_inner(pytester, "-k", "bf16 or reaches", *([f"--amp-report-dir={report}"] if report else []))


def test_the_oracle_passes_on_the_installed_lists(pytester, suite_copy):
    assert_clean(_run(pytester, suite_copy, None), at_least=2)


def test_an_op_moved_between_the_lists_fails_with_both_sides(pytester, suite_copy, tmp_path):
    lists = _lists_with(tmp_path, {"mse_loss": oracle.Expectation.LOWER_PRECISION})
    result = _run(pytester, suite_copy, lists)
    assert_caught(result, AGREES)
    result.stdout.fnmatch_lines(
        ["*F.mse_loss (mse_loss): PyTorch's list says lower precision, observed fp32*"], consecutive=False
    )


def test_an_op_the_catalogue_does_not_reach_fails_the_coverage_check(pytester, suite_copy, tmp_path, capsys):
    lists = _lists_with(tmp_path, {"frobnicate": oracle.Expectation.LOWER_PRECISION})
    result = _run(pytester, suite_copy, lists, report=pytester.path / "out")
    assert_caught(result, REACHES)
    result.stdout.fnmatch_lines(["*not reached: frobnicate*"], consecutive=False)
    # its script reads the same lists file and names the op (exit 1); on the installed lists, whose
    # every op the catalogue reaches, it exits 0
    capsys.readouterr()
    assert main(["repro", "--report", str(pytester.path / "out"), "--check", "reaches", "-o", str(tmp_path / "s")]) == 0
    (script,) = (tmp_path / "s").glob("*.py")
    status, said = _run_script(script, capsys)  # in this interpreter: it imports only torch and ast
    assert status == 1 and "not reached by the harness's catalogue: ['frobnicate']" in said, said
    installed = script.read_text(encoding="utf-8").replace(
        f"LISTS_FILE = {str(lists)!r}", f"LISTS_FILE = {str(oracle.installed_lists())!r}"
    )
    script.write_text(installed, encoding="utf-8")
    status, said = _run_script(script, capsys)
    assert status == 0, said


def _run_script(script: Path, capsys) -> tuple[int, str]:
    """A script's exit status and what it printed (run with runpy, its excepthook restored after)."""
    hook = sys.excepthook
    try:
        runpy.run_path(str(script), run_name="__main__")
        status = 0
    except SystemExit as exc:
        status = int(exc.code or 0)
    finally:
        sys.excepthook = hook
    return status, capsys.readouterr().out


def test_a_policy_regression_disagrees_with_pytorchs_lists(pytester, suite_copy):
    result = _run(
        pytester, suite_copy, None, patches={"torch.nn.functional.linear": "faults.autocast.linear_skips_autocast"}
    )
    assert_caught(result, AGREES)
    result.stdout.fnmatch_lines(
        ["*nn.Linear (linear): PyTorch's list says lower precision, observed fp32*"], consecutive=False
    )


def test_a_registered_finding_is_known_and_a_stale_one_fails(pytester, suite_copy, tmp_path):
    """KNOWN_DISAGREEMENTS turns a measured difference into a known row; an entry whose difference
    is gone (a release fixed it) fails until it is removed."""
    target = "harness.domains.autocast.oracle.KNOWN_DISAGREEMENTS"
    moved = _lists_with(tmp_path, {"mse_loss": oracle.Expectation.LOWER_PRECISION})
    known = _run(pytester, suite_copy, moved, patches={target: "faults.autocast.registry_with_the_mse_loss_finding"})
    assert_clean(known, at_least=2)
    stale = _run(pytester, suite_copy, None, patches={target: "faults.autocast.registry_with_a_stale_finding"})
    assert_caught(stale, AGREES)
    stale.stdout.fnmatch_lines(["*torch.mm: registered as disagreeing in torch *, but agrees now*"], consecutive=False)
