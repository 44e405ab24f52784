"""amp-harness: a pytest-based numerical regression harness for mixed-precision training.

Layers, each depending only on those above it:

1. pure numerics and comparison: :mod:`harness.numerics` (no pytest, no paths);
2. the machine and its kernels: :mod:`harness.platform` (detection, kernel sets, kernel probes);
3. one package per claim family: :mod:`harness.domains`;
4. storage and reports: :mod:`harness.storage.provenance`, :mod:`harness.storage.baselines`,
   :mod:`harness.storage.report`;
5. thin pytest glue: :mod:`harness.pytest_plugin.hooks`;
6. applications: the ``amp-harness`` command :mod:`harness.apps.cli`, qualify, the dashboard.
"""

__version__ = "0.1.0"
