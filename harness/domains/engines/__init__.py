"""The shared engines below the claim families: what several families run, none of them owns.

``training`` (recipes, the loop, the built-in models, the AMP lane and the seed band), ``bench``
(the interleaved timing bench and its size ladder), ``ops`` (the catalogue of ops and how one runs
under autocast), ``ranks`` (process groups on one host), ``rows`` (what a check needs of a
recorder) and ``state`` (bitwise comparison of parameters and optimizer state). A family imports
these and the core below them, never another family (pyproject.toml's import contract).
"""
