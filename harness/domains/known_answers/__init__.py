"""Claim family *known answers*: a card gives, bit for bit, the answers a healthy card of its
hardware class and software stack recorded for fixed mixed-precision computations; a burn-in loops
them and classifies what disagrees."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "known answers"
