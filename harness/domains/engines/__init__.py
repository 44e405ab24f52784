"""The shared engines below the claim families: what several families run, none of them owns.

``training`` (recipes, the loop, the built-in models, the AMP lane and the seed band), ``bench``
(the interleaved timing bench and its size ladder), ``ops`` (the catalogue of ops and how one runs
under autocast), ``compiler`` (whether Inductor compiles here, and compiling under autocast),
``ranks`` (the rank launcher, launched worlds and the toy model the ranks share), ``rows`` (what a
check needs of a recorder), ``scaled`` (the budgets and localisation of scaled low-precision
products, fp8 and block-scaled alike) and ``state`` (bitwise comparison of parameters and
optimizer state). A family imports these and the core below them, never another family
(pyproject.toml's import contract).
"""
