"""The training engine: recipes, the loop, the built-in models, the seed band and the AMP lane.

The training family's checks, the fp8 block-scaled training, the memory accounting and the speed
workloads all train through it; its names users need are re-exported by the training family
(``harness.domains.training.Setup``).
"""
