"""amp-harness: a pytest-based numerical regression harness for mixed-precision training.

Layers, each depending only on those above it:

1. pure numerics and comparison: :mod:`harness.formats`, :mod:`harness.tolerance`,
   :mod:`harness.compare` (no pytest, no paths);
2. storage and reports: :mod:`harness.hardware`, :mod:`harness.provenance`,
   :mod:`harness.baseline`, :mod:`harness.report`;
3. thin pytest glue: :mod:`harness.plugin`, and the ``amp-harness`` command :mod:`harness.cli`.
"""

__version__ = "0.1.0"
