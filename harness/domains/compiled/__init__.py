"""Claim family: torch.compile keeps autocast's promises (Inductor under autocast, judged against
eager AMP and float64).

``probe``: the one block every check observes; ``runs``: compiling it (and a training model) with a
backend and configuration variant; ``budget``: how far compiled may stray from float64 relative to
eager; ``known_issues``: compiled-AMP behaviour of torch releases, each with its observation;
``toolchain``: whether Inductor can compile here at all.
"""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "compiled AMP"
