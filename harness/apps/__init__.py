"""Layer 6, the top: applications built on everything below: the ``amp-harness`` command,
the qualification verdict and the regression dashboard."""
