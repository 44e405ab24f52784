"""Claim family *loss scaling*: reference semantics of dynamic loss scalers (torch, Megatron,
DeepSpeed, Apex), adapters, the known-issues registry, and the conformance state machine."""

#: the qualification capability this family's suite decides (harness/domains/capabilities.py)
CAPABILITY = "loss scaling"
