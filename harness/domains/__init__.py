"""Layer 3: one package per claim family, the shared engines below them all.

Claim families: autocast, block_scaled, compiled, distributed, formats, fp8, known_answers, memory,
patterns, scaler, speed, stochastic_rounding, training (the folders; :mod:`harness.domains.families`
reads them, and a test holds this list to them).

What each family needs to run its experiments and decide its verdicts, with torch: catalogues,
probes, reference specs, models, recipes, workloads. It may use :mod:`harness.numerics`; it never
touches files or pytest. A new claim family is a new package here plus one suite folder.
"""
