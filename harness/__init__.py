"""amp-harness: a pytest-based numerical regression harness for mixed-precision training.

Layers, each depending only on those above it:

1. pure numerics and comparison: :mod:`harness.numerics.formats`, :mod:`harness.numerics.tolerance`,
   :mod:`harness.numerics.comparison` (no pytest, no paths);
2. storage and reports: :mod:`harness.storage.hardware`, :mod:`harness.storage.provenance`,
   :mod:`harness.storage.baselines`, :mod:`harness.storage.report`;
3. thin pytest glue: :mod:`harness.pytest_plugin.hooks`, and the ``amp-harness`` command :mod:`harness.apps.cli`.
"""

__version__ = "0.1.0"
