"""Deliberately wrong implementations, one module per fault family: each must make a named check
of the suites fail (the ``tests/test_*_suite_can_fail.py`` files run the real suite files with
them injected).

* :mod:`faults.casts` fp32 -> low-precision casts (the format suite's ``cast_under_test``);
* :mod:`faults.autocast` autocast policy and kernel regressions (patched torch functions);
* :mod:`faults.scalers` GradScaler bugs (given to the scaler suite through ``scaler_factory``);
* :mod:`faults.training` training-loop regressions (patched GradScaler.step / F.linear);
* :mod:`faults.distributed` compression hooks, a sharded scaler and ranks that crash or hang.

Typed and checked by ``mypy --strict`` with the harness (``.ci/run``).
"""

from __future__ import annotations

NEGATIVE_CONTROL_PROFILE = "negative-control"


def register_negative_control_profile() -> None:
    """For runs that only need to show a check fails: the first counterexample, not the smallest.
    Hypothesis is imported here, not with the package: distributed ranks import ``faults``, and
    each would otherwise import hypothesis again (about 3 s per launch on 2 cores)."""
    from hypothesis import Phase, settings

    settings.register_profile(
        NEGATIVE_CONTROL_PROFILE,
        max_examples=40,
        derandomize=True,
        database=None,
        deadline=None,
        print_blob=False,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
