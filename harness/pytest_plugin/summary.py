"""What the session hands on at its end: the run report's metadata and the terminal section."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness import __version__
from harness.pytest_plugin.collaborators import display
from harness.pytest_plugin.options import explicit_hypothesis_profile, self_test_prefixes
from harness.pytest_plugin.state import State
from harness.storage import report as rp


def run_metadata(session: pytest.Session, st: State) -> dict[str, Any]:
    """``run.json``: environment, options, commit, times, test and row outcome counts, and each
    test's own result (``test_results``: :attr:`harness.storage.report.LoadedReport.tests`)."""
    return {
        **static_metadata(session.config, st),
        **machine_metadata(st),
        "finished": rp.now_iso(),
        "tests": dict(st.test_outcomes),
        "test_results": st.test_table(),
        "exitstatus": int(session.exitstatus),
        "row_outcomes": rp.summarize(st.rows),
        "write_errors": [{"path": p, "reason": why} for p, why in st.write_errors],
        # under pytest-xdist: what each worker ran on (its torch threads are part of its class)
        "xdist_workers": sorted(st.workers, key=lambda w: str(w.get("id"))),
        **({"recovered_journals": st.recovered_from} if st.recovered_from else {}),
        **({"resumed": st.resumed} if st.resumed is not None else {}),
    }


def machine_metadata(st: State) -> dict[str, Any]:
    """What the machine is (detected once, when first needed: it imports torch)."""
    return {
        "fingerprint": st.fingerprint.as_dict(),
        "profile": st.profile_for(st.primary_device),
        "primary_device": st.primary_device,
    }


def static_metadata(cfg: pytest.Config, st: State) -> dict[str, Any]:
    """What is known of the run at its start: the journal's header carries it, so that a run
    recovered after a crash has it too."""
    return {
        "harness_version": __version__,
        "started": st.started,
        "git_commit": st.commit,
        "options": {
            "devices": st.options.devices,
            "dtypes": list(st.options.dtypes),
            "profile_override": st.options.profile,
            "tier": st.options.tier,
            "baseline_mode": st.options.mode.value,
            # the profile amp-harness tests ran under (loaded around them only, so not the one
            # active at session end)
            "hypothesis_profile": explicit_hypothesis_profile(cfg) or st.options.hypothesis_profile,
            "hypothesis_seed": cfg.getoption("--hypothesis-seed", default=None),
        },
        "invocation": list(cfg.invocation_params.args),
        # the project's tests of itself (ini amp_self_tests): rp.origin_of tells them from the qualification
        rp.SELF_TESTS: list(self_test_prefixes(cfg)),
    }


def terminal_lines(st: State) -> list[str]:
    """The ``amp-harness`` section: baselines written, baselines unused, where the report went."""
    lines: list[str] = []
    if st.written:
        lines.append(f"baselines written: {len(st.written)}")
        lines += [f"  {display(Path(p))}" for p in sorted(st.written)]
    if st.write_errors:
        lines.append(f"NOT WRITTEN ({len(st.write_errors)}): the session fails; nothing else was lost")
        lines += [f"  {display(Path(p))}: {why}" for p, why in st.write_errors]
    interrupted = st.store.interrupted()
    if interrupted:
        lines.append(
            f"staged by an interrupted session and never moved into place ({len(interrupted)}): complete "
            "candidates; review each, then rename it to its baseline's name (drop the leading dot and the "
            "random suffix) or delete it"
        )
        lines += [f"  {display(p)}" for p in interrupted]
    unused = st.store.unused()
    if unused:
        why = f" ({st.deselected} deselected tests may use them)" if st.deselected else ""
        lines.append(f"baselines not used by any collected check in their directories{why}:")
        lines += [f"  {display(p)}" for p in unused]
    for path, broken in st.recovered_runs:
        lines.append(f"an interrupted run's journal, recovered into its report: {display(path)}")
        lines += broken
    if st.resumed is not None:
        lines.append(
            f"resumed: {st.resumed['finished_before']} tests finished in earlier parts ({st.resumed['from']}) not run "
            f"again; {st.resumed['left']} run now"
        )
    if st.broken:
        lines.append(f"tests that broke ({len(st.broken)}): a result each in the run report")
        lines += [f"  {str(b['result']).upper()} {b['nodeid']}: {b['message']}" for b in st.broken.values()]
    if st.journal_error:
        lines.append(f"journal not written ({st.journal_error}): a crash from here on would have lost the run")
    if st.report_path is not None:
        counts = rp.summarize(st.rows)
        detail = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
        lines.append(f"run report: {len(st.rows)} rows ({detail or 'none'}) -> {display(st.report_path)}")
    return lines
