"""Layer 2: one package per claim family (autocast, scaling, training, speed, memory, distributed).

What each family needs to run its experiments and decide its verdicts, with torch: catalogues,
probes, reference specs, models, recipes, workloads. It may use :mod:`harness.numerics`; it never
touches files or pytest. A new claim family is a new package here plus one suite folder.
"""
