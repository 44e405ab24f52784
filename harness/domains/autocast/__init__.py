"""Claim family *autocast*: the op catalogue (a table of ops as users call them) and the probe
that records what autocast does with each."""
