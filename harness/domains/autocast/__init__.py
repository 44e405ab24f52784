"""Claim family *autocast*: the op catalogue (a table of ops as users call them) and the probe
that records what autocast does with each."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY: tuple[str, ...] = ("autocast policy", "numerics")
#: why this family does not decide exactly one capability of its own
CAPABILITY_NOTE = "two questions a qualification answers apart: which dtype each op runs in (the policy table) and how far its result strays from float64 (the numerics budget); a stack may change one and not the other"
